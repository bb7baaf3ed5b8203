package pgtest

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// A ledger is a table beside a lease table with one row per guarded write
// (key, holder, fence), that tests of Guard read back to see which
// mandates' writes committed, and in which order.

// LedgerEntry is one row of a ledger table.
type LedgerEntry struct {
	ID     int64 // insertion order (NewLedger), or commit order (NewCommitOrderedLedger)
	Key    string
	Holder string
	Fence  int64
	Token  string // only in a commit-ordered ledger
}

// NewLedger creates a ledger table on db and returns its name: one row per
// guarded write, in commit-independent insertion order (id).
func NewLedger(tb testing.TB, db pglease.DB) string {
	tb.Helper()
	name := Name("ledger")
	_, err := db.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (
		id bigserial PRIMARY KEY, key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`, name))
	require.NoError(tb, err)
	return name
}

// ReadLedger reads every row of a ledger of NewLedger, in insertion order.
func ReadLedger(tb testing.TB, db pglease.DB, ledger string) []LedgerEntry {
	tb.Helper()
	return queryLedger(tb, db, fmt.Sprintf(`SELECT id, key, holder, fence, '' FROM %s ORDER BY id`, ledger))
}

// commitOrderedLedgerDDL creates a ledger whose rows are numbered in commit
// order: a deferred constraint trigger gives each row its number from a
// sequence at COMMIT, after every statement of the transaction. A
// transaction that waits on a row lock before its commit thus gets its
// number late, which an id drawn at INSERT would not show. The trigger runs
// before the commit is durable, so two transactions committing at once may
// be numbered in either order; a guarded one still holds the lease row then,
// so no later mandate's claim, hence no later mandate's write, can come
// between.
const commitOrderedLedgerDDL = `CREATE TABLE %[1]s (id bigserial PRIMARY KEY,
	key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL, token text NOT NULL UNIQUE, seq bigint);
CREATE SEQUENCE %[1]s_commit;
CREATE FUNCTION %[1]s_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE %[1]s SET seq = nextval('%[1]s_commit') WHERE id = NEW.id;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER number_at_commit AFTER INSERT ON %[1]s
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s_number()`

// NewCommitOrderedLedger creates a ledger on db whose rows are numbered in
// commit order (see commitOrderedLedgerDDL), each with a unique token that
// names the transaction that wrote it. It returns the ledger's name and
// the INSERT of one row, binding key, holder, fence and token to $1-$4.
func NewCommitOrderedLedger(tb testing.TB, db pglease.DB) (ledger, insert string) {
	tb.Helper()
	ledger = Name("ledger")
	_, err := db.Exec(context.Background(), fmt.Sprintf(commitOrderedLedgerDDL, ledger))
	require.NoError(tb, err)
	return ledger, fmt.Sprintf(`INSERT INTO %s (key, holder, fence, token) VALUES ($1, $2, $3, $4)`, ledger)
}

// ReadLedgerTokens reads every row of a ledger of NewCommitOrderedLedger in
// commit order, its number at commit (seq) as its ID.
func ReadLedgerTokens(tb testing.TB, db pglease.DB, ledger string) []LedgerEntry {
	tb.Helper()
	return queryLedger(tb, db, fmt.Sprintf(`SELECT seq, key, holder, fence, token FROM %s ORDER BY seq`, ledger))
}

// queryLedger reads the ledger entries query selects: id, key, holder,
// fence and token, in that order.
func queryLedger(tb testing.TB, db pglease.DB, query string) []LedgerEntry {
	tb.Helper()
	rows, err := db.Query(context.Background(), query)
	require.NoError(tb, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (LedgerEntry, error) {
		var e LedgerEntry
		return e, r.Scan(&e.ID, &e.Key, &e.Holder, &e.Fence, &e.Token)
	})
	require.NoError(tb, err)
	return out
}
