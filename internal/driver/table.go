package driver

import (
	"context"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// maxIdentifierLen is PostgreSQL's NAMEDATALEN - 1. A longer name would be
// truncated silently by the server, so two different table names could end
// up sharing one sequence; we refuse them instead.
const maxIdentifierLen = sqlstmt.MaxIdentifierLen

// fenceSeqSuffix names the sequence that issues fences, beside its table.
const fenceSeqSuffix = sqlstmt.FenceSeqSuffix

// Table is a validated, possibly schema-qualified, lease table name and the
// name of its fence sequence. SQL only ever sees them quoted.
type Table struct {
	Name pgx.Identifier
	Seq  pgx.Identifier
}

// ParseTable validates "name" or "schema.name". Each part must look like a
// plain SQL identifier (letters, digits, _ and $, not starting with a digit
// or $): names are quoted anyway, but a name that needs quoting to be legal
// is almost always a mistake, and refusing it keeps the statements readable
// in logs and pg_stat_statements.
func ParseTable(s string) (Table, error) {
	if s == "" {
		return Table{}, fmt.Errorf("table name is empty")
	}
	parts := strings.Split(s, ".")
	if len(parts) > 2 {
		return Table{}, fmt.Errorf("table name %q: want \"name\" or \"schema.name\"", s)
	}
	for _, p := range parts {
		if err := checkIdentifier(p); err != nil {
			return Table{}, fmt.Errorf("table name %q: %w", s, err)
		}
	}
	if len(parts) == 1 && slices.Contains(sqlstmt.PartNames, parts[0]) {
		return Table{}, fmt.Errorf("table name %q: pglease's statements name one of their parts %q, which would hide a table of that name: give it with its schema (public.%s)", s, s, s)
	}
	last := parts[len(parts)-1]
	if len(last)+len(fenceSeqSuffix) > maxIdentifierLen {
		return Table{}, fmt.Errorf("table name %q: longer than %d bytes, its sequence %q would be truncated by PostgreSQL",
			s, maxIdentifierLen-len(fenceSeqSuffix), last+fenceSeqSuffix)
	}
	return Table{Name: pgx.Identifier(parts), Seq: sqlstmt.FenceSeq(parts)}, nil
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
func (t Table) String() string { return strings.Join(t.Name, ".") }

// Render fills a statement template with the table's quoted names
// (sqlstmt.Render).
func (t Table) Render(tmpl string) string { return sqlstmt.Render(tmpl, t.Name) }

// DrewBackwards is the error of a claim that drew fence though a claim of
// the same Locker answered before it was sent had drawn drawn, no smaller:
// the fence sequence went backwards under the running Locker (the table
// and its sequence restored from a dump, or dropped and created again),
// and fences already issued are being issued again.
func (t Table) DrewBackwards(fence, drawn int64) error {
	return fmt.Errorf("the fence sequence went backwards: fence %d drawn after this Locker's claims drew %d "+
		"(the lease table or its sequence was restored or created again while replicas ran): stop the replicas, "+
		"then set the sequence above every fence issued, as in SELECT setval('%s', %d + 1000000)", fence, drawn, t.Seq.Sanitize(), drawn)
}

// TableUse is who checks a table (CheckTable), and so what is checked.
type TableUse int

// The users of a table.
const (
	Migrating     TableUse = iota // Migrate, which has just created the sequence if it was missing
	ClaimFenced                   // a Locker's first claim
	ClaimUnfenced                 // a Locker's first claim, WithoutFenceColumn: no fence, no sequence
)

// CheckTable refuses what sqlstmt.TableCheck reads, naming the statement
// that fixes it: a table or (when fenced) fence sequence that a crash
// would empty, a fence sequence that could issue a fence smaller than one
// it issued before, or stop issuing them (CREATE SEQUENCE IF NOT EXISTS
// keeps an existing sequence as an operator or a migration tool left it:
// CACHE 100 gives successive leases of a key fences 1, 101, 2), a fence
// column whose default does not draw from it, a sequence behind the
// table's fences (sqlstmt.FenceBehind), and a key column of a
// nondeterministic collation. Migrate reports a missing sequence (it has
// just created it, so a relation of that name is something else); for a
// Locker the claim's own error says it (no table at all, most often).
func CheckTable(ctx context.Context, db DB, t Table, use TableUse) error {
	var (
		found, cycle, fenceFound, fenceFromSeq bool
		increment, maxValue, cache             int64
		keyColl, keyType                       string
		tablePersistence, seqPersistence       string
		partition, keyBase, keyIndex           string
		fenceIdentity, timeColumns, missing    string
	)
	err := db.QueryRow(ctx, sqlstmt.TableCheck, t.Name.Sanitize(), t.Seq.Sanitize()).
		Scan(&found, &increment, &maxValue, &cache, &cycle, &keyColl, &keyType,
			&tablePersistence, &partition, &keyBase, &keyIndex, &seqPersistence, &fenceFound, &fenceIdentity, &fenceFromSeq, &timeColumns, &missing)
	if err != nil {
		// A deadline that ends the catalog read is named with it (57014
		// alone does not say whose).
		return fmt.Errorf("checking the table and its fence sequence: %w", WithCause(ctx, err))
	}
	fenced := use != ClaimUnfenced
	if !fenced {
		seqPersistence = ""
	}
	var errs []error
	if err := persistenceProblem(t, tablePersistence, partition, seqPersistence); err != nil {
		errs = append(errs, err)
	}
	if keyBase != "" && keyBase != "text" && keyBase != "character varying" {
		errs = append(errs, fmt.Errorf("column key is of type %s, which does not compare keys byte for byte (citext folds case, "+
			"character(n) ignores trailing spaces, name cuts at 63 bytes): two keys would share one lease row, and a lease "+
			"claimed under one spelling would be lost at its first heartbeat (run ALTER TABLE %s ALTER COLUMN key TYPE text)",
			keyBase, t.Name.Sanitize()))
	}
	if keyColl != "" {
		errs = append(errs, fmt.Errorf("column key has the nondeterministic collation %s: keys that differ in case or accents "+
			"would share one lease row, and a lease claimed under one spelling would be lost at its first heartbeat "+
			"(run ALTER TABLE %s ALTER COLUMN key TYPE %s COLLATE \"C\")", keyColl, t.Name.Sanitize(), keyType))
	}
	if missing != "" && fenced && use != Migrating {
		errs = append(errs, fmt.Errorf("the table lacks the columns %s, which this version writes: run Migrate, or %s",
			missing, t.Render(sqlstmt.AddColumns)))
	}
	if timeColumns != "" {
		errs = append(errs, fmt.Errorf("%s: an expiry must be a timestamptz of full precision (a timestamp without time zone "+
			"is read in each session's time zone, and a replica ahead would take a live lease; timestamptz(0) rounds an expiry "+
			"past a short lease's trust margin) (run ALTER TABLE %s ALTER COLUMN expires_at TYPE timestamptz, and the same for acquired_at)",
			timeColumns, t.Name.Sanitize()))
	}
	if index, coll, ok := strings.Cut(keyIndex, " "); ok {
		errs = append(errs, fmt.Errorf("index %s on column key has the nondeterministic collation %s: a claim's ON CONFLICT (key) "+
			"would take the row of another spelling of its key, and the lease would be lost at its first heartbeat (run DROP INDEX %s)",
			index, coll, index))
	}
	switch {
	case !fenced:
	case found:
		errs = append(errs, fenceSequenceProblem(t, increment, maxValue, cache, cycle))
		if fenceFound {
			errs = append(errs, fenceDefaultProblem(t, fenceIdentity, fenceFromSeq))
		}
	case use == Migrating:
		errs = append(errs, fmt.Errorf("%s is not a sequence: a relation of that name was there before Migrate, and every claim would fail "+
			"drawing its fence from it (rename or drop it, then run Migrate again)", t.Seq.Sanitize()))
	}
	if err := errors.Join(errs...); err != nil || !fenced || !found || !fenceFound {
		return err
	}
	return fenceBehind(ctx, db, t)
}

// persistenceProblem refuses a lease table (or partition of it, when
// partition names one) or fence sequence that a crash would empty
// (relpersistence 'u' or 't'; "" when not read or absent).
func persistenceProblem(t Table, table, partition, seq string) error {
	tableName := t.Name.Sanitize()
	if partition != "" {
		tableName = "partition " + partition + " of " + tableName
	}
	var problems []string
	for _, r := range []struct{ name, persistence string }{{tableName, table}, {t.Seq.Sanitize(), seq}} {
		switch r.persistence {
		case "u":
			problems = append(problems, r.name+" is UNLOGGED")
		case "t":
			problems = append(problems, r.name+" is TEMPORARY")
		}
	}
	if len(problems) == 0 {
		return nil
	}
	alter := t.Name.Sanitize()
	if partition != "" {
		alter = partition
	}
	return fmt.Errorf("%s: a crash would empty it, and live leases could be claimed again or fences issued twice (ALTER TABLE %s SET LOGGED; ALTER SEQUENCE %s SET LOGGED)",
		strings.Join(problems, ", "), alter, t.Seq.Sanitize())
}

// fenceDefaultProblem refuses a fence column whose default does not draw
// from the fence sequence: new rows would take fences from elsewhere, and
// a key's next lease could get a smaller one.
func fenceDefaultProblem(t Table, identity string, fromSeq bool) error {
	if identity == "" && fromSeq {
		return nil
	}
	what, drop := "has a default other than nextval of "+t.Seq.Sanitize(), ""
	if identity != "" {
		what = "is an identity column, which draws from a sequence of its own, not " + t.Seq.Sanitize()
		drop = fmt.Sprintf("run ALTER TABLE %s ALTER COLUMN fence DROP IDENTITY, then ", t.Name.Sanitize())
	}
	return fmt.Errorf("column fence %s: a new row's fence and a re-claim's would come from two sequences, and a key's next lease could get a smaller fence "+
		"(%srun ALTER TABLE %s ALTER COLUMN fence SET DEFAULT nextval('%s'))", what, drop, t.Name.Sanitize(), t.Seq.Sanitize())
}

// fenceBehind refuses a fence sequence whose last value is below the
// largest fence of the table (sqlstmt.FenceBehind).
func fenceBehind(ctx context.Context, db DB, t Table) error {
	var maxFence, last int64
	err := db.QueryRow(ctx, t.Render(sqlstmt.FenceBehind), t.Seq.Sanitize()).Scan(&maxFence, &last)
	if errors.Is(err, pgx.ErrNoRows) {
		return nil // the sequence went between the two reads: the claim says it
	}
	if err != nil {
		return fmt.Errorf("checking the fence sequence against the table's fences: %w", err)
	}
	if maxFence > last {
		return fmt.Errorf("fence sequence %s is behind the table's fences (its next fence %d, the largest fence %d): "+
			"a key's next lease would get a smaller fence (run SELECT setval('%s', (SELECT max(fence) FROM %s)))",
			t.Seq.Sanitize(), last+1, maxFence, t.Seq.Sanitize(), t.Name.Sanitize())
	}
	return nil
}

// fenceSequenceProblem says what makes a fence sequence unfit, if anything.
func fenceSequenceProblem(t Table, increment, maxValue, cache int64, cycle bool) error {
	seq := t.Seq.Sanitize()
	var problems []string
	if cache != 1 {
		problems = append(problems, fmt.Sprintf("caches %d values per session (each session draws its own block, so a later lease can get a smaller fence)", cache))
	}
	if cycle {
		problems = append(problems, "cycles (at its maximum it starts over from its minimum)")
	}
	if maxValue != math.MaxInt64 {
		problems = append(problems, fmt.Sprintf("stops at %d (every claim fails once it is reached)", maxValue))
	}
	if increment != 1 {
		problems = append(problems, fmt.Sprintf("increments by %d, not 1", increment))
	}
	if len(problems) == 0 {
		return nil
	}
	fix := fmt.Sprintf("run ALTER SEQUENCE %s AS bigint INCREMENT BY 1 NO MAXVALUE CACHE 1 NO CYCLE", seq)
	if increment < 0 {
		fix += "; it has counted down, so also RESTART it above every fence it has issued"
	}
	return fmt.Errorf("fence sequence %s %s: fences must only grow (%s)", seq, strings.Join(problems, ", "), fix)
}

// WithCause is err, the failure of a statement, wrapping the cause of
// ctx when ctx has ended and err does not say so already: a deadline that
// cut a statement short is named with it (57014 alone does not say whose),
// and a statement shared by a burst, which fails with its own context's
// error once every caller has given up, fails each caller with its own.
func WithCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}
