package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: heartbeat.go promises "a release stuck on an unreachable
// database delays no loss, and a row locked past it costs that lease
// alone". Guard makes a lease row lockable by the application for as long
// as it likes. An Unlock of that lease (from any goroutine, or from the
// job itself before its COMMIT) then waits on the row lock inside the
// release gate, and no heartbeat round may run while a release is in the
// gate: every other lease of the Locker starves and is lost.
func TestAnUnlockWaitingOnAGuardedRowDoesNotCostTheLockersOtherLeases(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second),
		pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithTimeout(4*time.Second))

	guarded, err := l.Claim(ctx, "guarded")
	require.NoError(t, err)
	other, err := l.Claim(ctx, "other")
	require.NoError(t, err)

	tx := guardedTx(t, pool, guarded)

	unlocked := make(chan error, 1)
	go func() { unlocked <- guarded.Unlock(ctx) }()

	// Three TTLs while the release waits: the heartbeat must keep "other".
	select {
	case <-other.Done():
		t.Errorf("lease %q was lost while an Unlock of %q waited on its guarded row: %v", other.Key(), guarded.Key(), other.Err())
	case <-time.After(3 * time.Second):
	}
	require.NoError(t, tx.Commit(ctx))
	// The release skipped the locked row and sent itself again until the
	// guarded transaction ended, within its timeout.
	// (its row lapsed meanwhile: the heartbeat could not extend a locked row)
	uerr := <-unlocked
	t.Logf("unlock of the guarded lease: %v", uerr)
	require.True(t, uerr == nil || errors.Is(uerr, pglease.ErrLost), "the release of the guarded lease: %v", uerr)
	require.NoError(t, other.Err())
}

// Guarantee: Close "releases every lease still held in one statement".
// With one lease's row held by a guarded transaction for longer than the
// Locker's timeout, that one statement waits on it and is cancelled: none
// of the other leases is released, and other replicas wait for their TTL.
// (The cancelled statement is not gone: pgx drops the connection, but the
// server keeps it waiting on the row lock, holding the other rows it has
// already updated, and it lands, unseen, once the guarded transaction ends.)
func TestCloseWithAGuardedTransactionOpenStillReleasesTheOtherLeases(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(time.Second)) // TTL 60s
	b := pgtest.Locker(t, pool, table, "b")

	guarded, err := a.Claim(ctx, "guarded")
	require.NoError(t, err)
	_, err = a.Claim(ctx, "other")
	require.NoError(t, err)

	tx := guardedTx(t, pool, guarded)

	cerr := a.Close(ctx) // the guarded transaction outlasts Close's timeout
	t.Logf("close: %v", cerr)

	// Another replica takes the key Close gave back, while the guarded
	// transaction of the other key is still open.
	cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = b.Claim(cctx, "other")
	cancel()
	assert.NoError(t, err, "the lease on %q, not guarded, should have been released by Close", "other")
	require.NoError(t, tx.Commit(ctx))
}

// Guarantee: "checks that this mandate is still the row's". The statement
// names the lease table without its schema, so it resolves it on the
// caller's connection, whose search_path may differ from the Locker's (a
// schema-per-tenant application sets it per transaction). There another
// table of that name, with its own fence sequence, can hold a row with the
// same key, holder and fence: Guard then approves a mandate its own table
// has already handed to a later one.
func TestGuardChecksTheLockersLeaseTableNotOneOfTheSameNameOnTheTransactionsSearchPath(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	admin := pgtest.Pool(t, nil)
	s1, s2 := pgtest.Name("tenant_a"), pgtest.Name("tenant_b")
	for _, s := range []string{s1, s2} {
		_, err := admin.Exec(ctx, "CREATE SCHEMA "+s)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
	}
	onPath := func(schema string) *pgxpool.Pool {
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["search_path"] = schema })
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable("lease")))
		return pool
	}
	poolA, poolB := onPath(s1), onPath(s2)

	// Tenant A: a's mandate, then a later one of the same service (holder
	// "svc" again, another Locker: a re-entrant claim with a new fence).
	first, err := pgtest.Locker(t, poolA, "lease", "svc").Claim(ctx, "job")
	require.NoError(t, err)
	later, err := pgtest.Locker(t, poolA, "lease", "svc").Claim(ctx, "job")
	require.NoError(t, err)
	require.Greater(t, later.Fence(), first.Fence())

	// Tenant B: the same service holds the same key, fence from its own
	// sequence.
	tenantB, err := pgtest.Locker(t, poolB, "lease", "svc").Claim(ctx, "job")
	require.NoError(t, err)
	require.Equal(t, first.Fence(), tenantB.Fence(), "both sequences start at 1")

	txA, err := poolA.Begin(ctx)
	require.NoError(t, err)
	require.ErrorIs(t, first.Guard(ctx, txA), pglease.ErrLost, "on the Locker's own table")
	require.NoError(t, txA.Rollback(ctx))

	txB, err := poolB.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = txB.Rollback(ctx) }()
	err = first.Guard(ctx, txB)
	assert.Error(t, err, "Guard approved a mandate that its own table handed to fence %d, by reading another schema's table", later.Fence())
}

// Guarantee: "tx is then aborted: its commit can only roll back even if the
// caller ignores Guard's error", in the outermost transaction, even when
// the caller goes on writing after the ignored error. (A savepoint rolled
// back after the failed Guard would undo the abort: Guard's documentation
// says to call it in the outermost transaction.)
func TestAFailedGuardWhoseErrorIsIgnoredKeepsTheOuterCommitFromLanding(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	a1 := pgtest.Locker(t, pool, table, "a")
	a2 := pgtest.Locker(t, pool, table, "a")

	first, err := a1.Claim(ctx, "job")
	require.NoError(t, err)
	tx := beginTx(t, pool)
	require.NoError(t, writeLedger(ctx, tx, ledger, first))

	later, err := a2.Claim(ctx, "job") // takes the key over
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, pool, ledger, later))

	gerr := first.Guard(ctx, tx)
	require.ErrorIs(t, gerr, pglease.ErrLost)
	t.Logf("guard (ignored by the caller): %v", gerr)
	require.Error(t, writeLedger(ctx, tx, ledger, first), "a write after the failed Guard went through")
	cerr := tx.Commit(ctx)
	require.Error(t, cerr, "the outer transaction of a failed Guard committed")

	for _, e := range readLedger(t, pool, ledger) {
		assert.NotEqual(t, first.Fence(), e.fence, "a write of fence %d landed after fence %d's", first.Fence(), later.Fence())
	}
}

// Guarantee: the guard survives a lock upgrade on the lease row in a
// savepoint that is rolled back (PostgreSQL before 9.3 dropped the share
// lock then).
func TestGuardSurvivesARolledBackSavepointThatLockedTheRowForUpdate(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a")
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)

	tx := guardedTx(t, pool, lease)
	sp, err := tx.Begin(ctx)
	require.NoError(t, err)
	_, err = sp.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR UPDATE`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	_, err = sp.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = holder WHERE key = 'job'`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	require.NoError(t, sp.Rollback(ctx))
	assert.True(t, rowLockedAgainstUpdate(t, pool, table, "job"), "the guard's share lock is gone after ROLLBACK TO SAVEPOINT")
}

// Guarantee: a Guard cancelled by its context while it waits on the row
// lock of a claim in flight must not leave a transaction that commits.
func TestGuardCancelledWhileWaitingOnAClaimInFlightLeavesNothingToCommit(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	l := pgtest.Locker(t, pool, table, "a")
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)

	claimInFlight, err := pool.Begin(ctx) // as a claim holds the row before it commits
	require.NoError(t, err)
	defer func() { _ = claimInFlight.Rollback(ctx) }()
	_, err = claimInFlight.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR NO KEY UPDATE`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)

	tx := beginTx(t, pool)
	require.NoError(t, writeLedger(ctx, tx, ledger, lease))
	gctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	gerr := lease.Guard(gctx, tx)
	cancel()
	require.Error(t, gerr)
	t.Logf("guard: %v", gerr)
	cerr := tx.Commit(ctx)
	t.Logf("commit: %v", cerr)
	require.Error(t, cerr)
	require.NoError(t, claimInFlight.Rollback(ctx))
	assert.Empty(t, readLedger(t, pool, ledger))
}

// Guarantee: Guard through PgBouncer in transaction mode, in every exec
// mode the library supports there: it guards, and it refuses a lost
// mandate.
func TestGuardThroughPgBouncerInTransactionMode(t *testing.T) {
	t.Parallel()
	for _, m := range bouncerModes(t) {
		t.Run(m.name, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			b := pgbouncer.New(t, pgtest.Server.DSN(), m.opts)
			pool := bouncedPool(t, b, m.mode)
			admin := pgtest.Pool(t, nil)
			table := pgtest.Table(t, admin)
			ledger := newLedger(t, admin)
			a1 := pgtest.Locker(t, pool, table, "a")
			a2 := pgtest.Locker(t, pool, table, "a")
			first, err := a1.Claim(ctx, "job")
			require.NoError(t, err)
			require.NoError(t, guardedWrite(ctx, pool, ledger, first))
			tx := guardedTx(t, pool, first)
			require.True(t, rowLockedAgainstUpdate(t, admin, table, "job"))
			require.NoError(t, tx.Commit(ctx))
			later, err := a2.Claim(ctx, "job")
			require.NoError(t, err)
			require.ErrorIs(t, guardedWrite(ctx, pool, ledger, first), pglease.ErrLost)
			require.NoError(t, guardedWrite(ctx, pool, ledger, later))
			assert.Len(t, readLedger(t, admin, ledger), 2)
		})
	}
}

// wrappedTx is an application's own pgx.Tx wrapper (tracing, metrics).
type wrappedTx struct{ pgx.Tx }

// Guarantee: "tx is nil" is named for a nil pgx.Tx; a wrapper around a nil
// transaction should be an error too, not a panic deep in Guard.
func TestGuardWithAWrapperAroundANilTransactionReturnsAnError(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
	require.NoError(t, err)
	var gerr error
	require.NotPanics(t, func() { gerr = lease.Guard(ctx, wrappedTx{}) })
	require.Error(t, gerr)
	require.NotErrorIs(t, gerr, pglease.ErrLost)
}

// Guarantee: Lock "claims key within the Locker's timeout", and a claim that
// fails hands out nothing. A claim waits on the row lock of a guarded
// transaction; Lock's timeout cancels it on the client, but pgx only drops
// the connection: the server keeps the statement waiting on the lock, and
// once the guarded transaction ends it takes the key for a holder that was
// told it failed. Nobody holds the Lease, nobody heartbeats or releases it,
// and every replica is refused the key for the claimer's whole TTL.
func TestALockThatTimedOutOnAGuardedRowDoesNotTakeTheKeyLater(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithTimeout(300*time.Millisecond)) // TTL 60s
	c := pgtest.Locker(t, pool, table, "c")

	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	tx := guardedTx(t, pool, lease)

	_, err = b.Lock(ctx, "job")
	require.Error(t, err)
	t.Logf("b's Lock: %v", err)
	var waiting int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, 'ON CONFLICT') > 0`).Scan(&waiting))
	t.Logf("claims still waiting on the server after Lock returned: %d", waiting)
	require.Eventually(t, func() bool { r, _ := pgtest.ReadRow(t, pool, table, "job"); return !r.Live }, 5*time.Second, 10*time.Millisecond,
		"a's row lapses while guarded")
	require.NoError(t, tx.Commit(ctx)) // the guarded writes land; the key is free

	// Give a cancelled statement every chance to land.
	deadline := time.Now().Add(time.Second)
	for time.Now().Before(deadline) {
		r, _ := pgtest.ReadRow(t, pool, table, "job")
		if r.Holder == "b" {
			break
		}
		time.Sleep(10 * time.Millisecond) // polling the row, bounded above
	}
	r, _ := pgtest.ReadRow(t, pool, table, "job")
	t.Logf("row after the guarded commit: %+v", r)
	_, held := b.Held("job")
	assert.False(t, held)
	_, err = c.Claim(ctx, "job")
	assert.NoError(t, err, "the key is nobody's lease, yet a claim is refused")
}
