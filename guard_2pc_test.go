package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: "no claim can take the key over before that transaction commits
// or rolls back" for a guarded transaction prepared for two-phase commit,
// across a crash of the server: the prepared transaction and its row lock
// must outlive the restart, so that no claim takes the key until COMMIT
// PREPARED, and the guarded write lands before the later mandate's.
func TestAPreparedGuardedTransactionKeepsTheKeyAcrossACrashUntilCommitPrepared(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	srv, err := pgserver.Start(ctx, pgserver.Options{Private: true, Durable: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	admin := pgtest.PoolAt(t, srv.DSN(), nil)
	_, err = admin.Exec(ctx, `ALTER SYSTEM SET max_prepared_transactions = 4`)
	require.NoError(t, err)
	admin.Close()
	require.NoError(t, srv.Restart(ctx, pgserver.Fast))

	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	table := pgtest.Table(t, pool)
	ledger := newLedger(t, pool)
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)

	tx := beginTx(t, pool)
	require.NoError(t, writeLedger(ctx, tx, ledger, lease))
	require.NoError(t, lease.Guard(ctx, tx))
	_, err = tx.Exec(ctx, `PREPARE TRANSACTION 'guarded'`)
	require.NoError(t, err)
	_ = tx.Rollback(ctx) // the session's transaction is over; the prepared one lives on

	require.NoError(t, srv.Restart(ctx, pgserver.Immediate))
	pool2 := pgtest.PoolAt(t, srv.DSN(), nil)
	b := pgtest.Locker(t, pool2, table, "b")

	// a's row has lapsed by now (TTL 1s, nobody could extend it across the
	// crash); b must still wait for the prepared guard.
	time.Sleep(1500 * time.Millisecond) // let a's server expiry pass: the fault, not a wait for an outcome
	cctx, cancel := context.WithTimeout(ctx, time.Second)
	_, err = b.Claim(cctx, "job")
	cancel()
	require.Error(t, err, "a claim took the key while a prepared guarded transaction was pending")
	t.Logf("claim while prepared: %v", err)

	_, err = pool2.Exec(ctx, `COMMIT PREPARED 'guarded'`)
	require.NoError(t, err)
	later, err := b.Claim(ctx, "job")
	require.NoError(t, err)
	require.Greater(t, later.Fence(), lease.Fence())
	require.NoError(t, guardedWrite(ctx, pool2, ledger, later))
	entries := readLedger(t, pool2, ledger)
	require.Len(t, entries, 2)
	assert.Equal(t, []int64{lease.Fence(), later.Fence()}, []int64{entries[0].fence, entries[1].fence})
}
