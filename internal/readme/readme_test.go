package readme_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/readme"
)

const exampleFile = `package p_test

import "fmt"

// Doc comment: not part of the snippet.
func ExampleGreet() {
	// Say hello.
	if true {
		fmt.Println("hello") // to stdout
	}
	// Output: hello
}

// greet says hello to name,
// in two lines of doc.
func greet(name string) {
	// Not a snippet's body: the whole declaration.
	fmt.Println("hello", name) // to stdout
}

func ExampleGreet_twice() {
	fmt.Println("a")
	fmt.Println("b")
	// Output:
	// a
	// b
}
`

func examples(t *testing.T) *readme.Examples {
	t.Helper()
	root := t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(root, "example_greet_test.go"), []byte(exampleFile), 0o600))
	require.NoError(t, os.Mkdir(filepath.Join(root, "sub"), 0o750))
	require.NoError(t, os.WriteFile(filepath.Join(root, "sub", "example_greet_test.go"), []byte(exampleFile), 0o600))
	return readme.NewExamples(root)
}

func TestRenderWritesTheDedentedBodyOfTheNamedExampleWithoutItsOutput(t *testing.T) {
	t.Parallel()
	doc := "# Title\n\n<!-- example: ExampleGreet -->\n```go\nstale\n```\n\n- item\n\n  <!-- example: sub.ExampleGreet_twice -->\n  ```go\n  ```\n\n```sh\n```go inside a shell block is text\n```\n"
	out, changed, err := readme.Render("doc.md", []byte(doc), examples(t).Body)
	require.NoError(t, err)
	assert.Equal(t, []string{"ExampleGreet", "sub.ExampleGreet_twice"}, changed)
	assert.Equal(t, "# Title\n\n<!-- example: ExampleGreet -->\n```go\n// Say hello.\nif true {\n\tfmt.Println(\"hello\") // to stdout\n}\n```\n\n"+
		"- item\n\n  <!-- example: sub.ExampleGreet_twice -->\n  ```go\n  fmt.Println(\"a\")\n  fmt.Println(\"b\")\n  ```\n\n```sh\n```go inside a shell block is text\n```\n", string(out))

	again, changed, err := readme.Render("doc.md", out, examples(t).Body)
	require.NoError(t, err)
	assert.Empty(t, changed, "a rendered document is up to date")
	assert.Equal(t, string(out), string(again))
}

func TestRenderWritesTheWholeDeclarationOfAFunctionThatIsNotAnExample(t *testing.T) {
	t.Parallel()
	doc := "<!-- example: greet -->\n```go\n```\n"
	out, changed, err := readme.Render("doc.md", []byte(doc), examples(t).Body)
	require.NoError(t, err)
	assert.Equal(t, []string{"greet"}, changed)
	assert.Equal(t, "<!-- example: greet -->\n```go\n// greet says hello to name,\n// in two lines of doc.\nfunc greet(name string) {\n"+
		"\t// Not a snippet's body: the whole declaration.\n\tfmt.Println(\"hello\", name) // to stdout\n}\n```\n", string(out))
}

func TestRenderRefusesUnmarkedGoBlocksAndMarkersOfMissingExamples(t *testing.T) {
	t.Parallel()
	_, _, err := readme.Render("doc.md", []byte("text\n```go\nx := 1\n```\n"), examples(t).Body)
	require.ErrorIs(t, err, readme.ErrUnmarked)
	assert.Contains(t, err.Error(), "doc.md:2:")

	_, _, err = readme.Render("doc.md", []byte("<!-- example: ExampleMissing -->\n```go\n```\n"), examples(t).Body)
	require.ErrorContains(t, err, "doc.md:1: no function ExampleMissing")

	_, _, err = readme.Render("doc.md", []byte("<!-- example: ExampleGreet -->\ntext\n"), examples(t).Body)
	require.ErrorContains(t, err, "marker for ExampleGreet is not followed by a ```go block")
}

func TestRenderGoDoc(t *testing.T) {
	t.Parallel()
	const src = "// Package p says hello.\n//\n//\tstale()\n//\n//\tstale()\n//\n// Text after.\n//\n//\tanother block, kept\npackage p\n"
	const want = "// Package p says hello.\n//\n//\t// greet says hello to name,\n//\t// in two lines of doc.\n//\tfunc greet(name string) {\n" +
		"//\t\t// Not a snippet's body: the whole declaration.\n//\t\tfmt.Println(\"hello\", name) // to stdout\n//\t}\n" +
		"//\n// Text after.\n//\n//\tanother block, kept\npackage p\n"

	t.Run("WritesTheFirstCodeBlockOfThePackageComment", func(t *testing.T) {
		t.Parallel()
		out, changed, err := readme.RenderGoDoc("doc.go", []byte(src), "greet", examples(t).Body)
		require.NoError(t, err)
		assert.True(t, changed)
		assert.Equal(t, want, string(out))

		again, changed, err := readme.RenderGoDoc("doc.go", out, "greet", examples(t).Body)
		require.NoError(t, err)
		assert.False(t, changed, "a rendered file is up to date")
		assert.Equal(t, want, string(again))
	})
	t.Run("ReplacesTheWholeBlockAcrossBlankLines", func(t *testing.T) {
		t.Parallel()
		out, changed, err := readme.RenderGoDoc("doc.go", []byte(src), "ExampleGreet_twice", examples(t).Body)
		require.NoError(t, err)
		assert.True(t, changed)
		assert.Equal(t, "// Package p says hello.\n//\n//\tfmt.Println(\"a\")\n//\tfmt.Println(\"b\")\n//\n// Text after.\n//\n//\tanother block, kept\npackage p\n", string(out))
	})
	t.Run("RefusesAPackageCommentWithoutCodeBlock", func(t *testing.T) {
		t.Parallel()
		_, _, err := readme.RenderGoDoc("doc.go", []byte("// Package p.\npackage p\n\n//\tnot the package comment\n"), "greet", examples(t).Body)
		require.ErrorContains(t, err, "doc.go: no code block in the package comment to hold greet")
	})
	t.Run("RefusesAMissingExample", func(t *testing.T) {
		t.Parallel()
		_, _, err := readme.RenderGoDoc("doc.go", []byte(src), "ExampleMissing", examples(t).Body)
		require.ErrorContains(t, err, "no function ExampleMissing")
	})
}
