package readme_test

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/readme"
)

func TestTestCommands(t *testing.T) {
	t.Parallel()
	doc := "Run `go test -run '^TestA$' .` or, over two lines, `go test -bench\nBenchmarkB .`.\n" +
		"```sh\n" +
		"go test -race ./...   # everything\n" +
		"    go test -run 'TestC/Sub' ./faults/ -args -x\n" +
		"```\n" +
		"`go vet` is not a test command.\n\n    go test -run TestD .\n"
	cmds := readme.TestCommands("d.md", doc)
	var texts []string
	var lines []int
	for _, c := range cmds {
		texts = append(texts, c.Text)
		lines = append(lines, c.Line)
	}
	assert.Equal(t, []string{
		"go test -run '^TestA$' .",
		"go test -bench BenchmarkB .",
		"go test -race ./...",
		"go test -run 'TestC/Sub' ./faults/ -args -x",
		"go test -run TestD .",
	}, texts)
	assert.Equal(t, []int{1, 1, 4, 5, 9}, lines)
}

func TestPatterns(t *testing.T) {
	t.Parallel()
	pats, err := readme.Patterns(`go test -race -count=1 -run 'TestA|TestB' -bench=. -benchtime 20x ./faults/ . -args -run X`)
	require.NoError(t, err)
	assert.Equal(t, []readme.Pattern{
		{Flag: "-run", Expr: "TestA|TestB", Packages: []string{"./faults/", "."}},
		{Flag: "-bench", Expr: ".", Packages: []string{"./faults/", "."}},
	}, pats)

	pats, err = readme.Patterns(`go test -fuzz FuzzX -fuzztime 10x -tags soak,x`)
	require.NoError(t, err)
	assert.Equal(t, []readme.Pattern{{Flag: "-fuzz", Expr: "FuzzX", Packages: []string{"."}, Tags: []string{"soak", "x"}}}, pats)

	_, err = readme.Patterns(`go test -run 'TestA`)
	require.ErrorContains(t, err, "unclosed")
	_, err = readme.Patterns(`go test -run`)
	require.ErrorContains(t, err, "-run has no pattern")
}

func TestUnmatched(t *testing.T) {
	t.Parallel()
	names := readme.Names{
		Top: []string{"TestLock", "TestGuard", "BenchmarkClaim", "FuzzKey", "ExampleLocker"},
		Subs: map[string][]*readme.Sub{
			"TestLock":  {{Name: "ExpiresInPlace"}, {Name: "Refuses_A_Stale_Lease", Subs: []*readme.Sub{{Dynamic: true}}}},
			"TestGuard": {{Name: "Drivers", Subs: []*readme.Sub{{Name: "pgx"}, {Name: "pq"}}}},
		},
	}
	for _, tc := range []struct {
		flag, expr string
		missing    []string
	}{
		{"-run", "TestLock|TestGuard", nil},
		{"-run", "^(TestLock|TestGone)$", []string{"^TestGone$"}},
		{"-run", "TestLock/ExpiresInPlace|Refuses_A", nil},
		{"-run", "TestLock/(Gone|ExpiresInPlace)", []string{"Gone"}},
		{"-run", "TestGuard/ExpiresInPlace", []string{"ExpiresInPlace"}},
		{"-run", "TestGuard/Drivers/pq", nil},
		{"-run", "TestGuard/pq", []string{"pq"}},
		{"-run", "TestLock/Refuses_A_Stale_Lease/anything", nil},
		{"-run", "TestRenamed|FuzzKey|ExampleLocker", []string{"TestRenamed"}},
		{"-run", "^$", nil},
		{"-run", "^$|TestGone", []string{"TestGone"}},
		{"-run", "BenchmarkClaim", []string{"BenchmarkClaim"}},
		{"-bench", ".", nil},
		{"-bench", "Claim|Release", []string{"Release"}},
		{"-fuzz", "FuzzKey", nil},
		{"-fuzz", "FuzzTable", []string{"FuzzTable"}},
		{"-run", "[|/]x|TestGuard", []string{"[|/]x"}},
	} {
		missing, err := readme.Unmatched(readme.Pattern{Flag: tc.flag, Expr: tc.expr}, names)
		require.NoError(t, err, tc.expr)
		assert.Equal(t, tc.missing, missing, "%s %s", tc.flag, tc.expr)
	}
	_, err := readme.Unmatched(readme.Pattern{Flag: "-run", Expr: "Test("}, names)
	require.Error(t, err)
}

func TestPackageNames(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(path, src string) {
		require.NoError(t, os.MkdirAll(filepath.Dir(filepath.Join(root, path)), 0o755))
		require.NoError(t, os.WriteFile(filepath.Join(root, path), []byte(src), 0o600))
	}
	write("a_test.go", "package p\nimport \"testing\"\n"+
		"func TestA(t *testing.T) { t.Run(\"one sub\", func(t *testing.T) { helper(t) }); for _, d := range ds { t.Run(\"Each/\"+d, nil) } }\n"+
		"func helper(t *testing.T) { t.Run(\"Deep\", nil); helper(t) }\n")
	write("faults/b_test.go", "package f\nimport \"testing\"\nfunc BenchmarkB(b *testing.B) { b.Run(\"x\", nil) }\n")
	write("faults/soak_test.go", "//go:build soak\n\npackage f\nimport \"testing\"\nfunc TestSoak(t *testing.T) {}\n")
	write("other/go.mod", "module other\n")
	write("other/c_test.go", "package o\nimport \"testing\"\nfunc TestC(t *testing.T) {}\n")

	names, err := readme.PackageNames(root, []string{"."})
	require.NoError(t, err)
	assert.Equal(t, []string{"TestA"}, names.Top)
	assert.Equal(t, []*readme.Sub{
		{Name: "one_sub", Subs: []*readme.Sub{{Name: "Deep"}}},
		{Name: "Each", Subs: []*readme.Sub{{Dynamic: true}}},
	}, names.Subs["TestA"])

	names, err = readme.PackageNames(root, []string{"./..."})
	require.NoError(t, err)
	assert.Equal(t, []string{"TestA", "BenchmarkB"}, names.Top)

	names, err = readme.PackageNames(root, []string{"./faults/"}, "soak")
	require.NoError(t, err)
	assert.ElementsMatch(t, []string{"BenchmarkB", "TestSoak"}, names.Top)
	assert.Equal(t, []*readme.Sub{{Name: "x"}}, names.Subs["BenchmarkB"])
}

func TestUnmatchedSelectsAsGoTestDoes(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	write := func(path, src string) {
		require.NoError(t, os.WriteFile(filepath.Join(root, path), []byte(src), 0o600))
	}
	write("a_test.go", "package p\nimport \"testing\"\n"+
		"func TestA(t *testing.T) { t.Run(\"One\", func(t *testing.T) { t.Run(\"Deep\", func(t *testing.T) {}) }) }\n"+
		"func TestB(t *testing.T) {}\n")
	write("tagged_test.go", "//go:build soak\n\npackage p\nimport \"testing\"\nfunc TestTagged(t *testing.T) {}\n")
	names, err := readme.PackageNames(root, []string{"."})
	require.NoError(t, err)
	for _, tc := range []struct{ name, expr, missing string }{
		// go test -run 'TestB/One' runs no subtest One: One is TestA's.
		{"SubtestOfAnotherTest", "TestB/One", "One"},
		// Deep is a subtest of One, at the third level, not the second:
		// TestA runs, no subtest of it.
		{"SubtestAtAnotherLevel", "TestA/Deep", "Deep"},
		// "^$|TestGone" runs nothing but a TestGone the package lacks.
		{"EmptyNameBesideAMissingTest", "^$|TestGone", "TestGone"},
		// TestTagged is built only with -tags soak, which the command lacks.
		{"TestOfABuildTagTheCommandLacks", "^TestTagged$", "^TestTagged$"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			missing, err := readme.Unmatched(readme.Pattern{Flag: "-run", Expr: tc.expr, Packages: []string{"."}}, names)
			require.NoError(t, err)
			assert.Contains(t, missing, tc.missing, "go test -run '%s' . runs no test (or subtest) %q names, and Unmatched accepts it", tc.expr, tc.missing)
		})
	}
}

// TestUnmatchedSelectsAsGoTestDoes pins what EveryTestCommandSelectsATest
// rests on: a pattern Unmatched accepts selects a test as go test runs it,
// each level of it within the tests the level above selected.
