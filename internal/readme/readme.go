// Package readme keeps the Go snippets of the project's Markdown files
// compiled: each snippet is the body of a runnable Example function, written
// into the Markdown by Render and checked by a test of the root package,
// the way bsm/redislock generates its README from example_test.go.
//
// A snippet is a ```go block whose line before is a marker naming the
// example:
//
//	<!-- example: ExampleLocker_Claim -->
//	```go
//	...
//	```
//
// A name alone is an Example of the root package; "pgleaseprom.ExampleNew"
// is one of the package in the directory pgleaseprom. The block becomes the
// body of that function, dedented, without its "// Output:" comment. A
// marker may also name another function of an example_*_test.go file, one
// that examples and tests call (a piece of code a user copies whole): the
// block is then its whole declaration, doc comment included. A ```go block
// without a marker is an error: every snippet is compiled.
//
// The package documentation of the root package quotes the quick start the
// same way, without a marker: the first code block of the package comment
// of each file of GoDocs is the snippet of the function named there
// (RenderGoDoc).
//
// Regenerate with `make readme` (or `go generate ./internal/readme`).
package readme

//go:generate go run ./cmd/readme -root ../..

import (
	"bytes"
	"errors"
	"fmt"
	"go/ast"
	"go/parser"
	"go/printer"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
)

// Docs are the Markdown files, relative to the module root, whose Go
// snippets come from examples.
var Docs = []string{"README.md", "docs/GUIDE.md", "docs/OPERATIONS.md"}

// marker is the line that names the example of the ```go block below it.
var marker = regexp.MustCompile(`^\s*<!--\s*example:\s*([A-Za-z0-9_./]+)\s*-->\s*$`)

// outputComment starts the comment that go test compares an example's
// output with: it belongs to the test, not to the snippet.
var outputComment = regexp.MustCompile(`^//\s*(Unordered output|Output):`)

// Examples finds snippets by reference ("ExampleX", "dir.ExampleX", or the
// name of another function) in the example_*_test.go files under a module
// root.
type Examples struct {
	root   string
	byDir  map[string]map[string]string
	loaded map[string]error
}

// NewExamples reads examples under the module root on demand.
func NewExamples(root string) *Examples {
	return &Examples{root: root, byDir: map[string]map[string]string{}, loaded: map[string]error{}}
}

// Body returns the snippet of ref: an Example's body, dedented, without
// its Output comment, or another function's whole declaration.
func (x *Examples) Body(ref string) (string, error) {
	dir, name := ".", ref
	if i := strings.LastIndex(ref, "."); i >= 0 {
		dir, name = ref[:i], ref[i+1:]
	}
	if _, done := x.loaded[dir]; !done {
		x.byDir[dir], x.loaded[dir] = exampleBodies(filepath.Join(x.root, filepath.FromSlash(dir)))
	}
	if err := x.loaded[dir]; err != nil {
		return "", err
	}
	body, ok := x.byDir[dir][name]
	if !ok {
		return "", fmt.Errorf("no function %s in %s/example_*_test.go", name, dir)
	}
	return body, nil
}

// exampleBodies parses the example_*_test.go files of dir and returns the
// snippet of each function, by name: the body of an Example, the
// declaration of any other.
func exampleBodies(dir string) (map[string]string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "example_*_test.go"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no example_*_test.go in %s", dir)
	}
	bodies := map[string]string{}
	fset := token.NewFileSet()
	for _, path := range files {
		f, err := parser.ParseFile(fset, path, nil, parser.ParseComments)
		if err != nil {
			return nil, err
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Recv != nil || fn.Body == nil {
				continue
			}
			var body string
			var err error
			if strings.HasPrefix(fn.Name.Name, "Example") {
				body, err = snippet(fset, f, fn.Body)
			} else {
				body, err = declaration(fset, f, fn)
			}
			if err != nil {
				return nil, fmt.Errorf("%s: %s: %w", path, fn.Name.Name, err)
			}
			bodies[fn.Name.Name] = body
		}
	}
	return bodies, nil
}

// snippet prints body with the comments inside it, except the Output
// comment, and strips the braces and one level of indentation.
func snippet(fset *token.FileSet, f *ast.File, body *ast.BlockStmt) (string, error) {
	var comments []*ast.CommentGroup
	for _, g := range f.Comments {
		if g.Pos() < body.Lbrace || g.End() > body.Rbrace || outputComment.MatchString(g.List[0].Text) {
			continue
		}
		comments = append(comments, g)
	}
	var b bytes.Buffer
	cfg := printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
	if err := cfg.Fprint(&b, fset, &printer.CommentedNode{Node: body, Comments: comments}); err != nil {
		return "", err
	}
	text := strings.TrimSpace(b.String())
	text = strings.TrimSuffix(strings.TrimPrefix(text, "{"), "}")
	lines := strings.Split(strings.Trim(text, "\n"), "\n")
	for i, line := range lines {
		lines[i] = strings.TrimRight(strings.TrimPrefix(line, "\t"), " \t")
	}
	return strings.Join(lines, "\n"), nil
}

// declaration prints fn whole, with its doc comment and the comments
// inside it.
func declaration(fset *token.FileSet, f *ast.File, fn *ast.FuncDecl) (string, error) {
	start := fn.Pos()
	if fn.Doc != nil {
		start = fn.Doc.Pos()
	}
	var comments []*ast.CommentGroup
	for _, g := range f.Comments {
		if g.Pos() >= start && g.End() <= fn.End() {
			comments = append(comments, g)
		}
	}
	var b bytes.Buffer
	cfg := printer.Config{Mode: printer.UseSpaces | printer.TabIndent, Tabwidth: 8}
	if err := cfg.Fprint(&b, fset, &printer.CommentedNode{Node: fn, Comments: comments}); err != nil {
		return "", err
	}
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	for i, line := range lines {
		lines[i] = strings.TrimRight(line, " \t")
	}
	return strings.Join(lines, "\n"), nil
}

// ErrUnmarked is returned for a ```go block with no marker before it.
var ErrUnmarked = errors.New("```go block without an <!-- example: ... --> marker on the line before: every Go snippet must come from a compiled Example")

// Render returns doc with the ```go block after each marker replaced by the
// example it names, and the names of the snippets that changed. name is
// the document's name in errors.
func Render(name string, doc []byte, examples func(ref string) (string, error)) (out []byte, changed []string, err error) {
	lines := strings.SplitAfter(string(doc), "\n")
	var b strings.Builder
	var errs []error
	for i := 0; i < len(lines); i++ {
		line := lines[i]
		trimmed := strings.TrimSpace(line)
		m := marker.FindStringSubmatch(line)
		switch {
		case m != nil:
			b.WriteString(line)
			ref := m[1]
			if i+1 >= len(lines) || strings.TrimSpace(lines[i+1]) != "```go" {
				errs = append(errs, fmt.Errorf("%s:%d: marker for %s is not followed by a ```go block", name, i+1, ref))
				continue
			}
			open := lines[i+1]
			indent := open[:len(open)-len(strings.TrimLeft(open, " \t"))]
			end := closing(lines, i+2)
			if end < 0 {
				errs = append(errs, fmt.Errorf("%s:%d: ```go block for %s is not closed", name, i+2, ref))
				b.WriteString(strings.Join(lines[i+1:], ""))
				i = len(lines)
				continue
			}
			old := strings.Join(lines[i+2:end], "")
			body, err := examples(ref)
			if err != nil {
				errs = append(errs, fmt.Errorf("%s:%d: %w", name, i+1, err))
				b.WriteString(strings.Join(lines[i+1:end+1], ""))
				i = end
				continue
			}
			fresh := indented(body, indent)
			if fresh != old {
				changed = append(changed, ref)
			}
			b.WriteString(open)
			b.WriteString(fresh)
			b.WriteString(lines[end])
			i = end
		case trimmed == "```go":
			errs = append(errs, fmt.Errorf("%s:%d: %w", name, i+1, ErrUnmarked))
			b.WriteString(line)
		case strings.HasPrefix(trimmed, "```"):
			// Another language's block: copied as is, so that nothing in
			// it reads as a marker or a fence.
			end := closing(lines, i+1)
			if end < 0 {
				end = len(lines) - 1
			}
			b.WriteString(strings.Join(lines[i:end+1], ""))
			i = end
		default:
			b.WriteString(line)
		}
	}
	return []byte(b.String()), changed, errors.Join(errs...)
}

// closing is the index of the line that closes the block whose content
// starts at from, or -1.
func closing(lines []string, from int) int {
	for j := from; j < len(lines); j++ {
		if strings.TrimSpace(lines[j]) == "```" {
			return j
		}
	}
	return -1
}

// indented prefixes each non-empty line of body with indent and ends every
// line with a newline.
func indented(body, indent string) string {
	var b strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if line != "" {
			b.WriteString(indent)
		}
		b.WriteString(line)
		b.WriteString("\n")
	}
	return b.String()
}

// RenderFile renders the document at path (relative to root) from the
// examples under root.
func RenderFile(root, path string, x *Examples) (out []byte, changed []string, err error) {
	doc, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path))) //nolint:gosec // one of Docs, under the module root
	if err != nil {
		return nil, nil, err
	}
	return Render(path, doc, x.Body)
}

// GoDocs are the Go files, relative to the module root, whose package
// documentation quotes an example: the first code block of the file's
// package comment is the snippet of the example named here.
var GoDocs = map[string]string{"doc.go": "runScheduler"}

// RenderGoDoc returns src, a Go file, with the first code block of its
// package comment (the lines indented by a tab after "//") replaced by the
// snippet of ref, and whether it changed. name is the file's name in
// errors.
func RenderGoDoc(name string, src []byte, ref string, examples func(ref string) (string, error)) (out []byte, changed bool, err error) {
	lines := strings.SplitAfter(string(src), "\n")
	start := -1
	for i, line := range lines {
		if strings.HasPrefix(line, "package ") {
			break
		}
		if strings.HasPrefix(line, "//\t") {
			start = i
			break
		}
	}
	if start < 0 {
		return nil, false, fmt.Errorf("%s: no code block in the package comment to hold %s", name, ref)
	}
	end := start // past the last code line: blank lines after it are text
	for j := start; j < len(lines); j++ {
		if strings.HasPrefix(lines[j], "//\t") {
			end = j + 1
			continue
		}
		if strings.TrimRight(lines[j], "\r\n") == "//" {
			continue // a blank line, inside the block if code follows it
		}
		break
	}
	body, err := examples(ref)
	if err != nil {
		return nil, false, fmt.Errorf("%s: %w", name, err)
	}
	var b strings.Builder
	for _, line := range strings.Split(body, "\n") {
		if line == "" {
			b.WriteString("//\n")
			continue
		}
		b.WriteString("//\t" + line + "\n")
	}
	fresh := b.String()
	old := strings.Join(lines[start:end], "")
	rest := strings.Join(lines[end:], "")
	return []byte(strings.Join(lines[:start], "") + fresh + rest), fresh != old, nil
}

// RenderGoDocFile renders the Go file at path (relative to root), one of
// GoDocs, from the examples under root.
func RenderGoDocFile(root, path string, x *Examples) (out []byte, changed bool, err error) {
	src, err := os.ReadFile(filepath.Join(root, filepath.FromSlash(path))) //nolint:gosec // one of GoDocs, under the module root
	if err != nil {
		return nil, false, err
	}
	return RenderGoDoc(path, src, GoDocs[path], x.Body)
}
