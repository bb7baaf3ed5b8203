package sqlstmt

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// TestPartNamesListEveryWithQueryOfTheStatements keeps PartNames complete:
// a statement that gives a new name to one of its parts, here or in the
// library, without adding it there would read a lease table of that name
// as its own part.
func TestPartNamesListEveryWithQueryOfTheStatements(t *testing.T) {
	withName := regexp.MustCompile(`(?:WITH|\),)\s+([a-z_][a-z0-9_$]*)\s+AS\s*\(`)
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	more, err := filepath.Glob("../../*.go")
	if err != nil {
		t.Fatal(err)
	}
	driverFiles, err := filepath.Glob("../driver/*.go")
	if err != nil {
		t.Fatal(err)
	}
	found := 0
	for _, f := range slices.Concat(files, more, driverFiles) {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		src, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range withName.FindAllStringSubmatch(string(src), -1) {
			found++
			if !slices.Contains(PartNames, m[1]) {
				t.Errorf("%s: a statement names a part %q that PartNames does not list", f, m[1])
			}
		}
	}
	if found == 0 {
		t.Fatal("no WITH query found: the pattern no longer matches the statements")
	}
}
