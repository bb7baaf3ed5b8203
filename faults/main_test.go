package faults_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// privateServer starts a PostgreSQL of the test's own, which it may stop and
// restart without disturbing the other tests. It is durable (fsync and
// synchronous_commit on), as production is: a claim acknowledged before a
// crash must survive it, or fences could go backwards.
func privateServer(t *testing.T) *pgserver.Server {
	t.Helper()
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Private: true, Durable: true})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	// Private never uses PGLEASE_DATABASE_URL: the server is ours to stop.
	require.True(t, srv.CanRestart(), "a %s server cannot be restarted", srv.Kind())
	return srv
}

// ledgerEntry is one row of a ledger table.
type ledgerEntry struct {
	id     int64
	key    string
	holder string
	fence  int64
	token  string // only in a commit-ordered ledger (commitOrderedLedgerDDL)
}

// queryLedger reads the ledger entries query selects: id, key, holder,
// fence and token, in that order.
func queryLedger(t *testing.T, db pglease.DB, query string) []ledgerEntry {
	t.Helper()
	rows, err := db.Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerEntry, error) {
		var e ledgerEntry
		return e, r.Scan(&e.id, &e.key, &e.holder, &e.fence, &e.token)
	})
	require.NoError(t, err)
	return out
}
