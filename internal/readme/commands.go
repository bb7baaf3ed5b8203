package readme

import (
	"fmt"
	"go/ast"
	"go/build/constraint"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
)

// TestDocs are the Markdown files, relative to the module root, whose
// `go test` commands CheckTestCommands checks.
var TestDocs = []string{
	"README.md", "docs/GUIDE.md", "docs/OPERATIONS.md", "docs/RELIABILITY.md",
	"docs/BENCHMARKS.md", "docs/MODEL.md", "docs/SCALING.md",
}

// Command is one `go test` command found in a Markdown file.
type Command struct {
	Doc  string
	Line int
	Text string
}

var (
	fence      = regexp.MustCompile("^\\s*```")
	inlineCode = regexp.MustCompile("`([^`]+)`")
)

// TestCommands returns every `go test` command of a Markdown document: each
// line of a fenced or an indented block, and each inline code span (which may run over a
// line break), from "go test" to its end or to a shell comment.
func TestCommands(doc string, text string) []Command {
	var cmds []Command
	add := func(line int, s string) {
		i := strings.Index(s, "go test")
		if i < 0 {
			return
		}
		s = s[i:]
		if j := strings.Index(s, " #"); j >= 0 {
			s = s[:j]
		}
		cmds = append(cmds, Command{Doc: doc, Line: line, Text: strings.Join(strings.Fields(s), " ")})
	}
	lines := strings.Split(text, "\n")
	var prose strings.Builder
	proseStart := 1
	flush := func() {
		p := prose.String()
		for _, m := range inlineCode.FindAllStringSubmatchIndex(p, -1) {
			add(proseStart+strings.Count(p[:m[0]], "\n"), p[m[2]:m[3]])
		}
		prose.Reset()
	}
	inBlock := false
	for n, line := range lines {
		switch {
		case fence.MatchString(line):
			if !inBlock {
				flush()
			}
			inBlock = !inBlock
			proseStart = n + 2
		case inBlock, strings.HasPrefix(strings.TrimSpace(line), "go test"):
			add(n+1, line) // a line of a fenced or an indented block
		default:
			prose.WriteString(line)
			prose.WriteString("\n")
		}
	}
	flush()
	return cmds
}

// Pattern is one name pattern of a command: the flag it follows (-run,
// -bench or -fuzz), the regular expression, and the packages it runs in.
type Pattern struct {
	Flag     string
	Expr     string
	Packages []string
	Tags     []string // the command's -tags
}

// Patterns reads the -run, -bench and -fuzz patterns of a `go test`
// command and the packages it names ("." when it names none). Arguments
// after -args belong to the test binary and are not read.
func Patterns(cmd string) ([]Pattern, error) {
	words, err := shellWords(cmd)
	if err != nil {
		return nil, err
	}
	var pats []Pattern
	var pkgs, tags []string
	for i := 2; i < len(words); i++ {
		w := words[i]
		if w == "-args" {
			break
		}
		name, value, hasValue := strings.Cut(strings.TrimPrefix(w, "-"), "=")
		switch {
		case !strings.HasPrefix(w, "-"):
			pkgs = append(pkgs, w)
		case name == "run" || name == "bench" || name == "fuzz":
			if !hasValue {
				if i+1 == len(words) {
					return nil, fmt.Errorf("%s has no pattern", w)
				}
				i++
				value = words[i]
			}
			pats = append(pats, Pattern{Flag: "-" + name, Expr: value})
		case name == "tags":
			if !hasValue && i+1 < len(words) {
				i++
				value = words[i]
			}
			tags = strings.FieldsFunc(value, func(r rune) bool { return r == ',' || r == ' ' })
		case !hasValue && takesValue[name]:
			i++
		}
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	for i := range pats {
		pats[i].Packages, pats[i].Tags = pkgs, tags
	}
	return pats, nil
}

// takesValue are the go test flags, other than the patterns, whose value
// is the next word when not given with "=".
var takesValue = map[string]bool{
	"count": true, "benchtime": true, "fuzztime": true, "timeout": true, "cpu": true,
	"parallel": true, "o": true, "cpuprofile": true, "memprofile": true, "coverprofile": true,
	"covermode": true, "coverpkg": true, "p": true, "exec": true, "list": true,
	"skip": true, "shuffle": true, "outputdir": true, "blockprofile": true, "mutexprofile": true,
	"trace": true,
}

// shellWords splits a command into words, as a POSIX shell does with
// single and double quotes (no expansions).
func shellWords(s string) ([]string, error) {
	var words []string
	var w strings.Builder
	inWord := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; c {
		case '\'', '"':
			j := strings.IndexByte(s[i+1:], c)
			if j < 0 {
				return nil, fmt.Errorf("unclosed %c quote in %q", c, s)
			}
			w.WriteString(s[i+1 : i+1+j])
			i += j + 1
			inWord = true
		case ' ', '\t':
			if inWord {
				words = append(words, w.String())
				w.Reset()
				inWord = false
			}
		default:
			w.WriteByte(c)
			inWord = true
		}
	}
	if inWord {
		words = append(words, w.String())
	}
	return words, nil
}

// Names are a package's test names: its top-level Test, Benchmark, Fuzz
// and Example functions, and under each the subtests its body (or a
// function of the package it calls) gives t.Run or b.Run, level by level,
// as go test names them (spaces as underscores, a "/" in a name starting
// a level). A name that is not a string literal (a table's field, a
// literal joined to a variable) is Dynamic from where it stops being
// known: go test may run any name there.
type Names struct {
	Top  []string
	Subs map[string][]*Sub
}

// Sub is a subtest's name at one level, and the subtests under it.
type Sub struct {
	Name    string
	Dynamic bool
	Subs    []*Sub
}

// PackageNames reads the names of the tests of every package a pattern
// names, relative to the module root: "." or "./dir" is one package,
// "./dir/..." every package under dir that belongs to the module. Files
// whose build constraints need a tag that tags (the command's -tags) lack
// are left out, as go test leaves them out.
func PackageNames(root string, pkgs []string, tags ...string) (Names, error) {
	names := Names{Subs: map[string][]*Sub{}}
	for _, p := range pkgs {
		dir, all := strings.CutSuffix(strings.TrimSuffix(p, "/"), "/...")
		if p == "./..." || p == "..." {
			dir, all = ".", true
		}
		dir = filepath.Join(root, filepath.FromSlash(dir))
		if !all {
			if err := namesIn(dir, tags, &names); err != nil {
				return names, err
			}
			continue
		}
		err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
			if err != nil || !d.IsDir() {
				return err
			}
			base := d.Name()
			if path != dir && (base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_") || isModule(path)) {
				return filepath.SkipDir
			}
			return namesIn(path, tags, &names)
		})
		if err != nil {
			return names, err
		}
	}
	return names, nil
}

func isModule(dir string) bool {
	_, err := os.Stat(filepath.Join(dir, "go.mod"))
	return err == nil
}

// builds reports whether a file with these build constraints is built for
// a test on this machine with tags.
func builds(file *ast.File, tags []string) bool {
	for _, group := range file.Comments {
		for _, c := range group.List {
			if !constraint.IsGoBuild(c.Text) {
				continue
			}
			expr, err := constraint.Parse(c.Text)
			if err != nil {
				return false
			}
			return expr.Eval(func(tag string) bool {
				return slices.Contains(tags, tag) || tag == runtime.GOOS || tag == runtime.GOARCH ||
					tag == "unix" || tag == "gc" || tag == "cgo" || strings.HasPrefix(tag, "go1.")
			})
		}
	}
	return true
}

// namesIn adds the names of the tests in the _test.go files of dir.
func namesIn(dir string, tags []string, names *Names) error {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	funcs := map[string]*ast.FuncDecl{}
	var tops []*ast.FuncDecl
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution|parser.ParseComments)
		if err != nil {
			return err
		}
		if !builds(file, tags) {
			continue
		}
		for _, decl := range file.Decls {
			fn, ok := decl.(*ast.FuncDecl)
			if !ok || fn.Recv != nil {
				continue
			}
			funcs[fn.Name.Name] = fn
			for _, prefix := range []string{"Test", "Benchmark", "Fuzz", "Example"} {
				if strings.HasPrefix(fn.Name.Name, prefix) {
					tops = append(tops, fn)
				}
			}
		}
	}
	for _, fn := range tops {
		names.Top = append(names.Top, fn.Name.Name)
		names.Subs[fn.Name.Name] = append(names.Subs[fn.Name.Name], subsOf(fn.Body, funcs, map[string]bool{fn.Name.Name: true})...)
	}
	return nil
}

// subsOf returns the subtests that node starts: its Run calls, each with
// the subtests of its function, and those of the package's functions it
// calls (seen guards against recursion).
func subsOf(node ast.Node, funcs map[string]*ast.FuncDecl, seen map[string]bool) []*Sub {
	var subs []*Sub
	ast.Inspect(node, func(n ast.Node) bool {
		call, ok := n.(*ast.CallExpr)
		if !ok {
			return true
		}
		if id, ok := call.Fun.(*ast.Ident); ok && funcs[id.Name] != nil && !seen[id.Name] {
			seen[id.Name] = true
			subs = append(subs, subsOf(funcs[id.Name].Body, funcs, seen)...)
			delete(seen, id.Name)
			return true
		}
		sel, ok := call.Fun.(*ast.SelectorExpr)
		if !ok || sel.Sel.Name != "Run" || len(call.Args) != 2 {
			return true
		}
		levels, dynamic := runName(call.Args[0])
		var children []*Sub
		for _, a := range call.Args[1:] {
			children = append(children, subsOf(a, funcs, seen)...)
		}
		sub := &Sub{Dynamic: true, Subs: children}
		if !dynamic {
			sub = &Sub{Name: levels[len(levels)-1], Subs: children}
			levels = levels[:len(levels)-1]
		}
		for i := len(levels) - 1; i >= 0; i-- {
			sub = &Sub{Name: levels[i], Subs: []*Sub{sub}}
		}
		subs = append(subs, sub)
		return false
	})
	return subs
}

// runName reads the name given to Run: the levels its known part names,
// and whether a part of it is known only at run time (the levels are then
// those before it).
func runName(arg ast.Expr) (levels []string, dynamic bool) {
	text, whole := literalPrefix(arg)
	text = strings.ReplaceAll(text, " ", "_")
	levels = strings.Split(text, "/")
	if whole {
		return levels, false
	}
	return levels[:len(levels)-1], true
}

// literalPrefix is the known start of a string expression, and whether it
// is the whole of it.
func literalPrefix(e ast.Expr) (string, bool) {
	switch e := e.(type) {
	case *ast.BasicLit:
		if s, err := strconv.Unquote(e.Value); err == nil && e.Kind == token.STRING {
			return s, true
		}
	case *ast.BinaryExpr:
		if e.Op == token.ADD {
			left, whole := literalPrefix(e.X)
			if !whole {
				return left, false
			}
			right, whole := literalPrefix(e.Y)
			return left + right, whole
		}
	case *ast.ParenExpr:
		return literalPrefix(e.X)
	}
	return "", false
}

// Unmatched returns the alternatives of p that select no test of names:
// at the first level of the pattern the top-level functions of its kind
// (-run: tests, fuzz targets and examples; -bench: benchmarks; -fuzz:
// fuzz targets), below it the subtests at that level of the tests and
// subtests the levels above select. An alternative that matches only the
// empty name ('^$', "run nothing") has nothing to select.
func Unmatched(p Pattern, names Names) ([]string, error) {
	var kinds []string
	switch p.Flag {
	case "-run":
		kinds = []string{"Test", "Fuzz", "Example"}
	case "-bench":
		kinds = []string{"Benchmark"}
	case "-fuzz":
		kinds = []string{"Fuzz"}
	}
	var level []*Sub
	for _, n := range names.Top {
		for _, k := range kinds {
			if strings.HasPrefix(n, k) {
				level = append(level, &Sub{Name: n, Subs: names.Subs[n]})
			}
		}
	}
	var missing []string
	for depth, elem := range splitTop(p.Expr, '/') {
		whole, err := regexp.Compile(elem)
		if err != nil {
			return nil, fmt.Errorf("pattern %q: %w", p.Expr, err)
		}
		for _, alt := range alternatives(elem) {
			re, err := regexp.Compile(alt)
			if err != nil {
				return nil, fmt.Errorf("pattern %q: %w", p.Expr, err)
			}
			if depth == 0 && re.MatchString("") && !re.MatchString("x") {
				continue
			}
			if !selects(re, level) {
				missing = append(missing, alt)
			}
		}
		var next []*Sub
		for _, s := range level {
			if s.Dynamic || whole.MatchString(s.Name) {
				next = append(next, s.Subs...)
			}
		}
		level = next
	}
	return missing, nil
}

func selects(re *regexp.Regexp, subs []*Sub) bool {
	for _, s := range subs {
		if s.Dynamic || re.MatchString(s.Name) {
			return true
		}
	}
	return false
}

// splitTop splits a regular expression at sep where sep is outside any
// brackets, parentheses and escapes: '/' as go test splits a pattern into
// levels, '|' into the alternatives of one level.
func splitTop(s string, sep byte) []string {
	var parts []string
	depth, start := 0, 0
	inClass := false
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
		case inClass:
			inClass = c != ']'
		case c == '[':
			inClass = true
		case c == '(':
			depth++
		case c == ')':
			depth--
		case c == sep && depth == 0:
			parts = append(parts, s[start:i])
			start = i + 1
		}
	}
	return append(parts, s[start:])
}

// alternatives returns the alternatives of one level of a pattern, those
// inside a group included: "^(TestA|TestB)$" is "^TestA$" and "^TestB$".
func alternatives(s string) []string {
	var out []string
	for _, alt := range splitTop(s, '|') {
		open, end := group(alt)
		if open < 0 {
			out = append(out, alt)
			continue
		}
		inner := strings.TrimPrefix(alt[open+1:end], "?:")
		if len(splitTop(inner, '|')) == 1 {
			out = append(out, alt)
			continue
		}
		for _, in := range alternatives(inner) {
			out = append(out, alternatives(alt[:open]+in+alt[end+1:])...)
		}
	}
	return out
}

// group returns the positions of the parentheses of the first group of s
// at its top level, or -1 when it has none.
func group(s string) (open, end int) {
	depth := 0
	inClass := false
	open = -1
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c == '\\':
			i++
		case inClass:
			inClass = c != ']'
		case c == '[':
			inClass = true
		case c == '(':
			if depth == 0 {
				open = i
			}
			depth++
		case c == ')':
			depth--
			if depth == 0 && open >= 0 {
				return open, i
			}
		}
	}
	return -1, -1
}
