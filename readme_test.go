package pglease_test

import (
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
}
