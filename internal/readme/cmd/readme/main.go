// Command readme writes the Go snippets of README.md and docs/OPERATIONS.md
// from the example functions they name (see package readme). Run it from
// the module root, or pass -root:
//
//	go run ./internal/readme/cmd/readme
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"

	"github.com/pglease/pglease/internal/readme"
)

func main() {
	root := flag.String("root", ".", "the module root")
	flag.Parse()
	if err := run(*root); err != nil {
		fmt.Fprintln(os.Stderr, "readme:", err)
		os.Exit(1)
	}
}

func run(root string) error {
	x := readme.NewExamples(root)
	for _, path := range readme.Docs {
		out, changed, err := readme.RenderFile(root, path, x)
		if err != nil {
			return err
		}
		if len(changed) == 0 {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(path)), out, 0o644); err != nil { //nolint:gosec // a document in the repository, readable by all
			return err
		}
		fmt.Printf("%s: wrote %v\n", path, changed)
	}
	return nil
}
