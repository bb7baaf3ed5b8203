package pglease

import (
	"fmt"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// DefaultTable is the name of the lease table when WithTable is not given.
const DefaultTable = "lease"

// maxIdentifierLen is PostgreSQL's NAMEDATALEN - 1. A longer name would be
// truncated silently by the server, so two different table names could end
// up sharing one sequence; we refuse them instead.
const maxIdentifierLen = sqlstmt.MaxIdentifierLen

// fenceSeqSuffix names the sequence that issues fences, beside its table.
const fenceSeqSuffix = sqlstmt.FenceSeqSuffix

// table is a validated, possibly schema-qualified, lease table name and the
// name of its fence sequence. SQL only ever sees them quoted.
type table struct {
	name pgx.Identifier
	seq  pgx.Identifier
}

// parseTable validates "name" or "schema.name". Each part must look like a
// plain SQL identifier (letters, digits, _ and $, not starting with a digit
// or $): names are quoted anyway, but a name that needs quoting to be legal
// is almost always a mistake, and refusing it keeps the statements readable
// in logs and pg_stat_statements.
func parseTable(s string) (table, error) {
	if s == "" {
		return table{}, fmt.Errorf("table name is empty")
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return table{}, fmt.Errorf("table name %q: want \"name\" or \"schema.name\"", s)
	}
	for _, p := range parts {
		if err := checkIdentifier(p); err != nil {
			return table{}, fmt.Errorf("table name %q: %w", s, err)
		}
	}
	if len(parts) == 1 && slices.Contains(sqlstmt.PartNames, parts[0]) {
		return table{}, fmt.Errorf("table name %q: pglease's statements name one of their parts %q, which would hide a table of that name: give it with its schema (public.%s)", s, s, s)
	}
	last := parts[len(parts)-1]
	if len(last)+len(fenceSeqSuffix) > maxIdentifierLen {
		return table{}, fmt.Errorf("table name %q: longer than %d bytes, its sequence %q would be truncated by PostgreSQL",
			s, maxIdentifierLen-len(fenceSeqSuffix), last+fenceSeqSuffix)
	}
	return table{name: pgx.Identifier(parts), seq: sqlstmt.FenceSeq(parts)}, nil
}

func checkIdentifier(p string) error {
	if p == "" {
		return fmt.Errorf("empty part")
	}
	if !utf8.ValidString(p) {
		return fmt.Errorf("not valid UTF-8")
	}
	if len(p) > maxIdentifierLen {
		return fmt.Errorf("part longer than %d bytes", maxIdentifierLen)
	}
	for i, r := range p {
		switch {
		case r == '_' || unicode.IsLetter(r):
		case (unicode.IsDigit(r) || r == '$') && i > 0:
		default:
			return fmt.Errorf("character %q at byte %d: only letters, digits, _ and $ are allowed, and no digit or $ first", r, i)
		}
	}
	return nil
}

// String is the name as the user gave it.
func (t table) String() string { return strings.Join(t.name, ".") }

// render fills a statement template with the table's quoted names
// (sqlstmt.Render).
func (t table) render(tmpl string) string { return sqlstmt.Render(tmpl, t.name) }
