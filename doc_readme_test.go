package pglease_test

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/readme"
)

// TestReadme keeps every Go snippet of README.md, docs/GUIDE.md and
// docs/OPERATIONS.md compiled: each is the body of the Example function its marker names (or the whole declaration
// of another function of an example file), and a ```go block without a
// marker is refused. The code block of the package documentation (doc.go)
// is the quick start's function in the same way. `make readme` rewrites
// the snippets.
func TestReadme(t *testing.T) {
	t.Parallel()
	// Guarantee: each snippet is the example it names, and none is unnamed.
	t.Run("SnippetsAreTheExamplesTheyName", func(t *testing.T) {
		t.Parallel()
		examples := readme.NewExamples(".")
		for _, doc := range readme.Docs {
			_, changed, err := readme.RenderFile(".", doc, examples)
			require.NoError(t, err)
			assert.Empty(t, changed, "%s: these snippets differ from their examples: run `make readme`", doc)
		}
		for path, ref := range readme.GoDocs {
			_, changed, err := readme.RenderGoDocFile(".", path, examples)
			require.NoError(t, err)
			assert.False(t, changed, "%s: its package documentation's code block differs from %s: run `make readme`", path, ref)
		}
	})
	// Guarantee: every -run, -bench and -fuzz pattern of a `go test`
	// command in the docs selects a test, in each of its alternatives and
	// levels, so that a renamed test cannot leave a command that runs
	// nothing.
	t.Run("EveryTestCommandSelectsATest", func(t *testing.T) {
		t.Parallel()
		checked := 0
		// The names of a set of packages, read once for all the commands
		// that name it: parsing every test file anew for each pattern was
		// most of this test's time.
		known := map[string]readme.Names{}
		for _, doc := range readme.TestDocs {
			text, err := os.ReadFile(doc)
			require.NoError(t, err)
			for _, cmd := range readme.TestCommands(doc, string(text)) {
				pats, err := readme.Patterns(cmd.Text)
				require.NoError(t, err, "%s:%d: %s", cmd.Doc, cmd.Line, cmd.Text)
				for _, p := range pats {
					key := strings.Join(p.Packages, " ") + "\x00" + strings.Join(p.Tags, ",")
					names, ok := known[key]
					if !ok {
						names, err = readme.PackageNames(".", p.Packages, p.Tags...)
						require.NoError(t, err)
						known[key] = names
					}
					missing, err := readme.Unmatched(p, names)
					require.NoError(t, err, "%s:%d: %s", cmd.Doc, cmd.Line, cmd.Text)
					assert.Empty(t, missing, "%s:%d: `%s`: these parts of %s %q select no test of %v", cmd.Doc, cmd.Line, cmd.Text, p.Flag, p.Expr, p.Packages)
					checked++
				}
			}
		}
		require.Positive(t, checked, "no go test pattern found in %v", readme.TestDocs)
	})
}
