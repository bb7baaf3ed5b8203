// Command readme writes the Go snippets of the project's Markdown files
// (readme.Docs) from the example functions they name, and the code block
// of the package documentation (readme.GoDocs) from its example (see
// package readme). Run it from
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
	for path := range readme.GoDocs {
		out, changed, err := readme.RenderGoDocFile(root, path, x)
		if err != nil {
			return err
		}
		if !changed {
			continue
		}
		if err := os.WriteFile(filepath.Join(root, filepath.FromSlash(path)), out, 0o644); err != nil { //nolint:gosec // a source file in the repository, readable by all
			return err
		}
		fmt.Printf("%s: wrote %s\n", path, readme.GoDocs[path])
	}
	return nil
}
