package readme

import (
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
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
	var pkgs []string
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
		case !hasValue && takesValue[name]:
			i++
		}
	}
	if len(pkgs) == 0 {
		pkgs = []string{"."}
	}
	for i := range pats {
		pats[i].Packages = pkgs
	}
	return pats, nil
}

// takesValue are the go test flags, other than the patterns, whose value
// is the next word when not given with "=".
var takesValue = map[string]bool{
	"count": true, "benchtime": true, "fuzztime": true, "timeout": true, "cpu": true,
	"parallel": true, "o": true, "cpuprofile": true, "memprofile": true, "coverprofile": true,
	"covermode": true, "coverpkg": true, "tags": true, "p": true, "exec": true, "list": true,
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
// and Example functions, and the names its tests give t.Run and b.Run
// as string literals (with spaces as go test writes them, underscores).
type Names struct {
	Top  []string
	Subs []string
}

// PackageNames reads the names of the tests of every package a pattern
// names, relative to the module root: "." or "./dir" is one package,
// "./dir/..." every package under dir that belongs to the module.
func PackageNames(root string, pkgs []string) (Names, error) {
	var names Names
	for _, p := range pkgs {
		dir, all := strings.CutSuffix(strings.TrimSuffix(p, "/"), "/...")
		if p == "./..." || p == "..." {
			dir, all = ".", true
		}
		dir = filepath.Join(root, filepath.FromSlash(dir))
		if !all {
			if err := namesIn(dir, &names); err != nil {
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
			return namesIn(path, &names)
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

// namesIn adds the names of the tests in the _test.go files of dir.
func namesIn(dir string, names *Names) error {
	files, err := filepath.Glob(filepath.Join(dir, "*_test.go"))
	if err != nil {
		return err
	}
	fset := token.NewFileSet()
	for _, f := range files {
		file, err := parser.ParseFile(fset, f, nil, parser.SkipObjectResolution)
		if err != nil {
			return err
		}
		for _, decl := range file.Decls {
			if fn, ok := decl.(*ast.FuncDecl); ok && fn.Recv == nil {
				for _, prefix := range []string{"Test", "Benchmark", "Fuzz", "Example"} {
					if strings.HasPrefix(fn.Name.Name, prefix) {
						names.Top = append(names.Top, fn.Name.Name)
					}
				}
			}
		}
		ast.Inspect(file, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok || len(call.Args) != 2 {
				return true
			}
			if sel, ok := call.Fun.(*ast.SelectorExpr); !ok || sel.Sel.Name != "Run" {
				return true
			}
			if lit, ok := call.Args[0].(*ast.BasicLit); ok && lit.Kind == token.STRING {
				if s, err := strconv.Unquote(lit.Value); err == nil {
					names.Subs = append(names.Subs, strings.ReplaceAll(s, " ", "_"))
				}
			}
			return true
		})
	}
	return nil
}

// Unmatched returns the alternatives of p that match none of names: at the
// first level of the pattern the top-level functions of its kind (-run:
// tests, fuzz targets and examples; -bench: benchmarks; -fuzz: fuzz
// targets), below it the subtests' names. A pattern that matches only the
// empty name ('^$', "run nothing") has nothing to match.
func Unmatched(p Pattern, names Names) ([]string, error) {
	if re, err := regexp.Compile(p.Expr); err == nil && re.MatchString("") && !re.MatchString("x") {
		return nil, nil
	}
	var kinds []string
	switch p.Flag {
	case "-run":
		kinds = []string{"Test", "Fuzz", "Example"}
	case "-bench":
		kinds = []string{"Benchmark"}
	case "-fuzz":
		kinds = []string{"Fuzz"}
	}
	var top []string
	for _, n := range names.Top {
		for _, k := range kinds {
			if strings.HasPrefix(n, k) {
				top = append(top, n)
			}
		}
	}
	var missing []string
	for level, elem := range splitTop(p.Expr, '/') {
		within := names.Subs
		if level == 0 {
			within = top
		}
		for _, alt := range alternatives(elem) {
			re, err := regexp.Compile(alt)
			if err != nil {
				return nil, fmt.Errorf("pattern %q: %w", p.Expr, err)
			}
			if !matchesAny(re, within) {
				missing = append(missing, alt)
			}
		}
	}
	return missing, nil
}

func matchesAny(re *regexp.Regexp, names []string) bool {
	for _, n := range names {
		if re.MatchString(n) {
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
