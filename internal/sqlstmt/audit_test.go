package sqlstmt

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

// A statement that changes lease rows is safe to send only if it acts on
// the mandate it names, or cannot do harm however late it arrives: a
// statement held up on the network may reach the server after its sender
// gave up and went on (claimed again, released, closed). Each class says
// how a statement of it keeps that, and checks its text for it.
type writeClass struct {
	why  string
	must []string // fragments the statement's text must contain
}

var (
	// leaseOfFence: matched on the lease's key, holder and fence, and
	// only while live: a later mandate, of any holder, has another fence.
	leaseOfFence = writeClass{"matches key, holder and fence of one live lease", []string{
		"fence = ", "holder = $1", "expires_at > clock_timestamp()",
	}}
	// leaseOfForgedHolder: without a fence column each mandate has a
	// holder of its own, matched with the key.
	leaseOfForgedHolder = writeClass{"matches key and the holder forged for one live lease", []string{
		"AND l.holder = ", "expires_at > clock_timestamp()",
	}}
	// claimOfFreeOrOwn: a claim takes only a row that is expired or the
	// holder's own, and never moves its expiry back, so that arriving late
	// it cannot cut short a lease its holder still trusts nor take one of
	// another holder's.
	claimOfFreeOrOwn = writeClass{"takes only an expired row or its own, never moving the expiry back", []string{
		"WHERE lease.holder = EXCLUDED.holder", "OR lease.expires_at <= clock_timestamp()",
		"GREATEST(lease.expires_at, EXCLUDED.expires_at)",
	}}
	// tickClaimOfFreeOrOwn is claimOfFreeOrOwn for the claim of a tick,
	// which also takes the row only for a tick after the row's.
	tickClaimOfFreeOrOwn = writeClass{"takes only an expired row or its own, for a later tick, never moving the expiry back", []string{
		"lease.holder = EXCLUDED.holder", "OR lease.expires_at <= clock_timestamp()",
		"GREATEST(lease.expires_at, EXCLUDED.expires_at)", "lease.tick < EXCLUDED.tick",
	}}
	// unfencedClaimOfFreeOrOwn is claimOfFreeOrOwn for the forged holders
	// of a table without a fence column.
	unfencedClaimOfFreeOrOwn = writeClass{"takes only an expired row or one of its own forged holders, never moving the expiry back", []string{
		"OR lease.expires_at <= clock_timestamp()", "left(lease.holder, length($4::text)) = $4::text",
		"GREATEST(lease.expires_at, EXCLUDED.expires_at)",
	}}
	// unfencedTickClaimOfExpired is the claim of a tick without a fence
	// column: it takes only an expired row, of no holder's live lease,
	// and only for a tick after the one the row's holder carries.
	unfencedTickClaimOfExpired = writeClass{"takes only an expired row, for a tick after its holder's, never moving the expiry back", []string{
		"WHERE lease.expires_at <= clock_timestamp()", "< right(EXCLUDED.holder, 27) COLLATE \"C\"",
		"GREATEST(lease.expires_at, EXCLUDED.expires_at)",
	}}
	// purgeOfLongExpired: deletes only rows expired for longer than the
	// retention, which no claim in flight can still be waiting on.
	purgeOfLongExpired = writeClass{"deletes only rows expired for the whole retention", []string{
		"expires_at < clock_timestamp() - make_interval(secs => $1)",
	}}
	// operatorUnderRowLock: an operator's change, sent in the transaction
	// that read the row and locked it (LockRow): it acts on exactly the
	// mandate that read showed, which nothing can change in between.
	operatorUnderRowLock = writeClass{"acts in the transaction that read and locked the row", []string{
		"WHERE key = $1 AND holder IS NOT DISTINCT FROM $2",
	}}
	// partOfMine: the part of a heartbeat statement that extends the rows
	// its CTE mine matched (on a mandate, by the statement's class).
	partOfMine = writeClass{"extends only the rows a statement's mine matched, never moving an expiry back", []string{
		"FROM mine", "GREATEST(",
	}}
	// benchmark: what the benchmarks compare against or set up, never sent
	// by the library.
	benchmark = writeClass{"benchmark baseline or set-up, never sent by the library", nil}
)

// writes names every statement of this package that changes lease rows,
// with its class. A statement that changes rows and is not listed fails
// the audit: whoever adds one says here how it stays harmless.
var writes = map[string]writeClass{
	"Claim":                     claimOfFreeOrOwn,
	"ClaimAll":                  claimOfFreeOrOwn,
	"ClaimTick":                 tickClaimOfFreeOrOwn,
	"UnfencedClaim":             unfencedClaimOfFreeOrOwn,
	"UnfencedClaimTick":         unfencedTickClaimOfExpired,
	"Heartbeat":                 leaseOfFence,
	"Release":                   leaseOfFence,
	"ReleaseOne":                leaseOfFence,
	"ReleaseOneQuiet":           leaseOfFence,
	"releaseOneRow":             leaseOfFence,
	"UnfencedHeartbeat":         leaseOfForgedHolder,
	"UnfencedRelease":           leaseOfForgedHolder,
	"UnfencedReleaseQuiet":      leaseOfForgedHolder,
	"unfencedReleaseRows":       leaseOfForgedHolder,
	"ReleaseQuiet":              leaseOfFence,
	"ReleaseRuns":               leaseOfFence,
	"ReleaseRunsQuiet":          leaseOfFence,
	"releaseRunRows":            leaseOfFence,
	"ReleaseOneRun":             leaseOfFence,
	"ReleaseOneRunQuiet":        leaseOfFence,
	"releaseOneRunRow":          leaseOfFence,
	"releaseRows":               leaseOfFence,
	"extendMine":                partOfMine,
	"Purge":                     purgeOfLongExpired,
	"Revoke":                    operatorUnderRowLock,
	"ForceExpire":               operatorUnderRowLock,
	"SeedLeases":                benchmark,
	"BaselinePerLeaseHeartbeat": benchmark,
	"BaselineUnhardenedClaim":   benchmark,
	"BaselineUnhardenedRelease": benchmark,
}

// writeTo finds a statement that inserts, updates or deletes rows of the
// lease table ({table}).
var writeTo = regexp.MustCompile(`(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+\{table\}`)

// TestEveryStatementThatChangesLeaseRowsMatchesItsLeaseOrIsHarmlessWhenLate
// enumerates every string constant of the package (its value as the
// compiler sees it), finds those that change lease rows, and checks each
// against its class: the next statement cannot forget to name its mandate.
func TestEveryStatementThatChangesLeaseRowsMatchesItsLeaseOrIsHarmlessWhenLate(t *testing.T) {
	consts := packageConstants(t, ".")
	found := map[string]bool{}
	for name, text := range consts {
		if !writeTo.MatchString(text) {
			continue
		}
		found[name] = true
		class, ok := writes[name]
		if !ok {
			t.Errorf("%s changes lease rows but is not in the audit's list: say how it stays harmless when it arrives late (a class of audit_test.go)", name)
			continue
		}
		for _, frag := range class.must {
			if !strings.Contains(text, frag) {
				t.Errorf("%s is audited as a statement that %s, but lacks %q:\n%s", name, class.why, frag, text)
			}
		}
	}
	for name, class := range writes {
		if class.must != nil && !found[name] {
			t.Errorf("the audit lists %s, which is no statement changing lease rows", name)
		}
	}
	for _, name := range []string{"Claim", "Release", "Heartbeat"} {
		if !found[name] {
			t.Fatalf("the audit found no %s: the enumeration of constants is broken", name)
		}
	}
}

// sqlText finds a string that is a SQL statement.
var sqlText = regexp.MustCompile(`^\s*(?:SELECT\s|INSERT\s+INTO\s|UPDATE\s+[{"a-z]|DELETE\s+FROM\s|WITH\s+\w+\s+AS\s*\(|CREATE\s|ALTER\s|DROP\s|LISTEN\s+[{"]|DO\s+\$\$)`)

// TestNoSQLOutsideThisPackage keeps every statement the library sends in
// this package, where the audit above reads it: the library's packages
// hold no string literal that is a SQL statement.
func TestNoSQLOutsideThisPackage(t *testing.T) {
	for _, dir := range []string{"../..", "../../cmd/pglease", "../../pgleaseui", "../driver"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		if err != nil {
			t.Fatal(err)
		}
		if len(files) == 0 {
			t.Fatalf("no Go file in %s", dir)
		}
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			for _, lit := range stringLiterals(t, f) {
				if sqlText.MatchString(lit.text) {
					t.Errorf("%s: SQL outside internal/sqlstmt: %q", lit.pos, firstLine(lit.text))
				}
			}
		}
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(strings.TrimSpace(s), "\n")
	return line
}

type strLit struct {
	pos  string
	text string
}

func stringLiterals(t *testing.T, file string) []strLit {
	t.Helper()
	fset := token.NewFileSet()
	f, err := parser.ParseFile(fset, file, nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []strLit
	ast.Inspect(f, func(n ast.Node) bool {
		if lit, ok := n.(*ast.BasicLit); ok && lit.Kind == token.STRING {
			if s, err := strconv.Unquote(lit.Value); err == nil {
				out = append(out, strLit{fset.Position(lit.Pos()).String(), s})
			}
		}
		return true
	})
	return out
}

// packageConstants evaluates every string constant declared in the
// non-test files of dir: literals, and sums of literals and constants.
func packageConstants(t *testing.T, dir string) map[string]string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	sort.Strings(files)
	exprs := map[string]ast.Expr{}
	fset := token.NewFileSet()
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, decl := range f.Decls {
			gd, ok := decl.(*ast.GenDecl)
			if !ok || gd.Tok != token.CONST {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				for i, name := range vs.Names {
					if i < len(vs.Values) {
						exprs[name.Name] = vs.Values[i]
					}
				}
			}
		}
	}
	out := map[string]string{}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.ParenExpr:
			return eval(e.X)
		case *ast.BinaryExpr:
			if e.Op != token.ADD {
				return "", false
			}
			a, ok1 := eval(e.X)
			b, ok2 := eval(e.Y)
			return a + b, ok1 && ok2
		case *ast.Ident:
			x, ok := exprs[e.Name]
			if !ok {
				return "", false
			}
			return eval(x)
		}
		return "", false
	}
	for name, e := range exprs {
		if s, ok := eval(e); ok {
			out[name] = s
		}
	}
	if len(out) == 0 {
		t.Fatal("no string constant found")
	}
	return out
}
