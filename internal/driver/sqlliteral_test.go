package driver

import (
	"testing"
	"time"
)

// TestInlineArgs checks, with no server, how a statement's arguments are
// written in its text for lib/pq; the database/sql tests at the root send
// them to PostgreSQL.
func TestInlineArgs(t *testing.T) {
	t.Parallel()
	var nilText *string
	cases := []struct {
		name  string
		query string
		args  []any
		want  string
	}{
		{"EachParameterByItsNumber", "SELECT $2, $1", []any{"a", int64(7)}, "SELECT E'7', E'a'"},
		{"QuotesAndBackslashesEscaped", "SELECT $1", []any{`it's \ done`}, `SELECT E'it''s \\ done'`},
		{"NilIsNull", "SELECT $1, $2", []any{nil, nilText}, "SELECT NULL, NULL"},
		{"NotInsideQuotedText", `SELECT '$1', "$1", E'\'$1', $1`, []any{"x"}, `SELECT '$1', "$1", E'\'$1', E'x'`},
		{"NotInsideComments", "SELECT /* $1 /* $1 */ */ $1 -- $1\n", []any{"x"}, "SELECT /* $1 /* $1 */ */ E'x' -- $1\n"},
		{"NotInsideDollarQuotes", "SELECT $q$ $1 $q$, $1", []any{"x"}, "SELECT $q$ $1 $q$, E'x'"},
		{"NotPartOfAName", "SELECT a$1, $1", []any{"x"}, "SELECT a$1, E'x'"},
		{"ArrayOfText", "SELECT $1", []any{[]string{`a"b`, "c"}}, `SELECT E'{"a\\"b","c"}'`},
		{"TimeInUTC", "SELECT $1", []any{time.Date(2026, 1, 2, 3, 4, 5, 0, time.FixedZone("", 3600))}, "SELECT E'2026-01-02T02:04:05Z'"},
		{"NoArguments", "SELECT 1", nil, "SELECT 1"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := inlineArgs(tc.query, tc.args)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %s, want %s", got, tc.want)
			}
		})
	}
	refused := []struct {
		name  string
		query string
		args  []any
	}{
		{"AParameterWithoutArgument", "SELECT $2", []any{"x"}},
		{"TextWithANulByte", "SELECT $1", []any{"a\x00b"}},
		{"TextNotUTF8", "SELECT $1", []any{"\xff"}},
		{"ATypeItCannotWrite", "SELECT $1", []any{struct{}{}}},
	}
	for _, tc := range refused {
		t.Run("Refuses"+tc.name, func(t *testing.T) {
			t.Parallel()
			if got, err := inlineArgs(tc.query, tc.args); err == nil {
				t.Errorf("got %s, want an error", got)
			}
		})
	}
}
