package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// LockRow takes the row lock of key in table in another transaction, as a
// long report or a stuck migration would; the test fails if there is no
// such row. The returned function ends that transaction (commit or
// rollback; see EndOnce).
func LockRow(tb testing.TB, db pglease.DB, table, key string) (end func(commit bool)) {
	tb.Helper()
	ctx := Ctx(tb)
	tx, err := db.Begin(ctx)
	require.NoError(tb, err)
	var fence int64
	require.NoError(tb, tx.QueryRow(ctx, fmt.Sprintf(`SELECT fence FROM %s WHERE key = $1 FOR UPDATE`, pgx.Identifier{table}.Sanitize()), key).Scan(&fence))
	return EndOnce(tb, tx)
}

// LockTable takes an EXCLUSIVE lock on table in another transaction, as a
// migration or an operator's LOCK TABLE would: reads go on, and every
// statement that locks or writes a row waits, the heartbeat included (it
// skips locked rows, but cannot skip a table lock). It returns that
// transaction and the function that ends it (commit or rollback; see
// EndOnce).
func LockTable(tb testing.TB, db pglease.DB, table string) (pgx.Tx, func(commit bool)) {
	tb.Helper()
	ctx := Ctx(tb)
	tx, err := db.Begin(ctx)
	require.NoError(tb, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %s IN EXCLUSIVE MODE`, pgx.Identifier{table}.Sanitize()))
	require.NoError(tb, err)
	return tx, EndOnce(tb, tx)
}

// EndOnce returns the function that ends tx, committing or rolling back,
// the first time it is called (the test fails if that fails); a
// transaction not ended by the test is rolled back at cleanup.
func EndOnce(tb testing.TB, tx pgx.Tx) func(commit bool) {
	tb.Helper()
	var once sync.Once
	end := func(commit bool) {
		once.Do(func() {
			if commit {
				require.NoError(tb, tx.Commit(context.Background()))
			} else {
				require.NoError(tb, tx.Rollback(context.Background()))
			}
		})
	}
	tb.Cleanup(func() { end(false) })
	return end
}

// LockRows holds the row locks of the rows of table that where selects (a
// condition on its columns, args binding $1...), as an operator's or a
// guarded job's open transaction would: it returns that transaction, rolled
// back at cleanup if it has not ended by then.
func LockRows(tb testing.TB, db pglease.DB, table, where string, args ...any) pgx.Tx {
	tb.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE %s FOR UPDATE`,
		pgx.Identifier(strings.Split(table, ".")).Sanitize(), where), args...)
	require.NoError(tb, err)
	return tx
}

// LockWaiter waits until a backend of application app (of any application
// when app is empty) waits on a lock while running a statement that
// contains fragment, and returns its pid; the test fails after limit.
func LockWaiter(tb testing.TB, db pglease.DB, app, fragment string, limit time.Duration) int32 {
	tb.Helper()
	var pid int32
	require.Eventually(tb, func() bool {
		err := db.QueryRow(context.Background(), `SELECT pid FROM pg_stat_activity
			WHERE ($1::text = '' OR application_name = $1) AND wait_event_type = 'Lock' AND strpos(query, $2) > 0 LIMIT 1`,
			app, fragment).Scan(&pid)
		return err == nil
	}, limit, 5*time.Millisecond, "a statement of %q containing %q blocked on a lock", app, fragment)
	return pid
}

// BlockedBy waits until a backend waits on a lock that tx holds, however
// long the waiting statement's text (pg_stat_activity keeps only its
// start); the test fails after limit.
func BlockedBy(tb testing.TB, db pglease.DB, tx pgx.Tx, limit time.Duration) {
	tb.Helper()
	var blocker int32
	require.NoError(tb, tx.QueryRow(context.Background(), `SELECT pg_backend_pid()`).Scan(&blocker))
	require.Eventually(tb, func() bool {
		var blocked bool
		err := db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE $1::int = ANY (pg_blocking_pids(pid)))`, blocker).Scan(&blocked)
		return err == nil && blocked
	}, limit, 5*time.Millisecond, "a statement blocked by the transaction of backend %d", blocker)
}
