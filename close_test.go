package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// liveRows counts the rows of table that are live now.
func liveRows(t *testing.T, db pglease.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT count(*) FROM %s WHERE expires_at > clock_timestamp()`, pgx.Identifier{table}.Sanitize())).Scan(&n))
	return n
}

func TestCloseReleasesAThousandLeasesWithinItsTimeoutOverASlowNetwork(t *testing.T) {
	t.Parallel()
	ctx, direct, table := pgtest.Setup(t)
	proxy := newProxy(t, "")
	counter := &pgtest.Statements{}
	pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Host, cfg.ConnConfig.Port = proxy.Host(), proxy.Port()
		cfg.ConnConfig.Tracer = counter
	})
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(events.Hook)) // default TTL and timeout

	const n = 1000
	leases := make([]*pglease.Lease, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for w := range 4 { // claimed before the latency is added
		wg.Go(func() {
			for i := w; i < n; i += 4 {
				leases[i], errs[i] = l.Claim(ctx, fmt.Sprintf("k%04d", i))
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		require.NoError(t, err)
	}
	require.Equal(t, n, liveRows(t, direct, table))

	// 5 ms each way: one round trip per lease would take 10 s, twice the
	// default timeout of Close.
	proxy.SetLatency(5*time.Millisecond, 0, 1)
	counter.Reset()
	start := time.Now()
	closeErr := l.Close(ctx)
	took := time.Since(start)

	live := liveRows(t, direct, table)
	require.Zero(t, live, "rows still live after Close (took %v, %d release statements)", took, counter.Count("release"))
	if closeErr != nil {
		t.Fatalf("Close: %.300s", closeErr)
	}
	assert.LessOrEqual(t, counter.Count("release"), 3, "a few statements, not one per lease")
	assert.Equal(t, n, events.Count(pglease.EventReleased), "each lease's release reported")
	assert.Zero(t, events.Count(pglease.EventReleaseFailed))
	for _, lease := range leases {
		require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
	}
	t.Logf("figures: Close of %d leases over 10 ms round trips took %v in %d statements",
		n, took.Round(time.Millisecond), counter.Count("release"))
}

func TestCloseKeepsTheMinHoldAndLeavesALaterMandatesRowUntouched(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"fenced", "unfenced"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			pool, table, opts := leaseTable(t, mode == "fenced")
			opts = append(opts, pglease.WithTTL(30*time.Second), pglease.WithMinHold(20*time.Second))
			events := pgtest.NewEvents(t)
			a := pgtest.Locker(t, pool, table, "a", append(opts, pglease.WithHook(events.Hook))...)
			kept, err := a.Claim(ctx, "kept")
			require.NoError(t, err)
			taken, err := a.Claim(ctx, "taken")
			require.NoError(t, err)
			// The same replica, restarted, takes "taken" back with a new
			// mandate before the old Locker closes.
			next, err := pgtest.Locker(t, pool, table, "a", opts...).Claim(ctx, "taken")
			require.NoError(t, err)

			require.NoError(t, a.Close(ctx), "a lease lost to a later mandate is not an error of Close")
			require.ErrorIs(t, kept.Err(), pglease.ErrClosed)
			require.ErrorIs(t, taken.Err(), pglease.ErrClosed)

			var keptExp, nextExp time.Time
			var nextHolder string
			q := fmt.Sprintf(`SELECT expires_at FROM %s WHERE key = $1`, pgx.Identifier{table}.Sanitize())
			require.NoError(t, pool.QueryRow(ctx, q, "kept").Scan(&keptExp))
			assert.Equal(t, kept.AcquiredAt().Add(20*time.Second).UnixMicro(), keptExp.UnixMicro(), "released to acquired_at + min hold")
			require.NoError(t, pool.QueryRow(ctx,
				fmt.Sprintf(`SELECT holder, expires_at FROM %s WHERE key = $1`, pgx.Identifier{table}.Sanitize()), "taken").Scan(&nextHolder, &nextExp))
			assert.Equal(t, next.Holder(), nextHolder)
			assert.Equal(t, next.ExpiresAt().UnixMicro(), nextExp.UnixMicro(), "the later mandate's row is untouched")

			assert.Equal(t, 1, events.Count(pglease.EventReleased))
			assert.Equal(t, 1, events.Count(pglease.EventReleaseFailed))
			require.NoError(t, next.Unlock(ctx))
		})
	}
}

// Guarantee: Close ends a waiting claim whose statement is in flight, waits
// for it, and leaves no live row of it.
func TestCloseDuringAWaitingClaimInFlightLeavesNoLiveRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	wire := pgtest.NewWire(t, pool)
	a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

	claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
	waited := make(chan error, 1)
	go func() {
		_, err := a.ClaimWait(ctx, "job")
		waited <- err
	}()
	<-claim.Hit
	require.NoError(t, a.Close(ctx))
	// ClaimWait has returned by now (its goroutine reports it just after);
	// its claim's reply is still held, so only Close can have ended it.
	select {
	case err := <-waited:
		require.ErrorIs(t, err, pglease.ErrClosed)
	case <-time.After(5 * time.Second):
		t.Fatal("Close returned before the waiting claim in flight")
	}
	requireNoLiveRowOf(t, pool, table, "a", 0, "job")
}

// Guarantee: every failure of Guard leaves its transaction aborted, also
// when its context ends while the guard statement waits on the row lock,
// and when Guard runs in a pgx nested transaction whose savepoint the
// caller then releases.
func TestFailedGuardAbortsTheTransactionWhateverEndedIt(t *testing.T) {
	// Its cases share a table and run in turn.
	ctx, pool, table := pgtest.Setup(t)
	_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{table + "_w"}.Sanitize()+` (v int)`)
	require.NoError(t, err)
	insert := `INSERT INTO ` + pgx.Identifier{table + "_w"}.Sanitize() + ` VALUES (1)`
	count := func() int {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table + "_w"}.Sanitize()).Scan(&n))
		return n
	}
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(10*time.Second))

	t.Run("ContextEndsOnTheRowLock", func(t *testing.T) {
		lease, err := a.Claim(ctx, "lockwait")
		require.NoError(t, err)
		defer func() { _ = lease.Unlock(ctx) }()
		blocker := pgtest.LockRows(t, pool, table, "key = $1", "lockwait")
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, insert)
		require.NoError(t, err)
		gctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		defer cancel()
		err = lease.Guard(gctx, tx)
		require.Error(t, err)
		require.NoError(t, blocker.Rollback(ctx))
		if cerr := tx.Commit(ctx); cerr == nil {
			t.Fatalf("a Guard that failed (%v) left a transaction that commits", err)
		}
		require.Equal(t, 0, count())
	})

	t.Run("ContextAlreadyEnded", func(t *testing.T) {
		lease, err := a.Claim(ctx, "ended")
		require.NoError(t, err)
		defer func() { _ = lease.Unlock(ctx) }()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, insert)
		require.NoError(t, err)
		gctx, cancel := context.WithCancel(ctx)
		cancel()
		require.Error(t, lease.Guard(gctx, tx))
		require.Error(t, tx.Commit(ctx), "a Guard with an ended context left a transaction that commits")
		require.Equal(t, 0, count())
	})

	t.Run("NestedSavepointReleased", func(t *testing.T) {
		lease, err := a.Claim(ctx, "nested")
		require.NoError(t, err)
		_, err = a.Claim(ctx, "nested") // re-entrant: lease is now an old mandate
		require.NoError(t, err)
		require.Error(t, lease.Err())
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		_, err = tx.Exec(ctx, insert)
		require.NoError(t, err)
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, lease.Guard(ctx, sp), pglease.ErrLost)
		_ = sp.Commit(ctx) // the careless caller releases the savepoint
		require.Error(t, tx.Commit(ctx), "an old mandate's transaction committed after its failed Guard")
		require.Equal(t, 0, count())
	})

	t.Run("OldMandateNeverCommitsAfterANewerClaim", func(t *testing.T) {
		lease, err := a.Claim(ctx, "race")
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(ctx) }()
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, lease.Guard(ctx, sp))
		require.NoError(t, sp.Commit(ctx)) // released savepoint: its lock stays with tx
		reclaimed := make(chan int64, 1)
		go func() {
			ls, err := a.Claim(ctx, "race")
			if err != nil {
				reclaimed <- -1
				return
			}
			reclaimed <- ls.Fence()
		}()
		select {
		case f := <-reclaimed:
			t.Fatalf("a newer claim (fence %d) returned while the old mandate's guarded transaction was open", f)
		case <-time.After(300 * time.Millisecond):
		}
		_, err = tx.Exec(ctx, insert)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		require.Greater(t, <-reclaimed, lease.Fence())
	})
}

// Guarantee: never two holders trusting a lease of one key at once, on a
// pool of one connection whose claims wait on a locked row while the
// heartbeat needs the connection.
func TestPoolOfOneNeverLetsTwoHoldersTrustOneKey(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) { c.MaxConns = 1 })
	other := pgtest.Pool(t, nil)
	table := pgtest.Table(t, other)
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second))
	b := pgtest.Locker(t, other, table, "b", pglease.WithTTL(2*time.Second))

	held, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	_, err = a.Claim(ctx, "locked")
	require.NoError(t, err)
	blocker := pgtest.LockRows(t, other, table, "key = $1", "locked")
	claimed := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
		defer cancel()
		_, err := a.Claim(cctx, "locked")
		claimed <- err
	}()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		trusted := held.Err() == nil
		ls, err := b.Claim(ctx, "job")
		if err == nil {
			require.False(t, trusted, "b claimed job (fence %d) while a still trusted fence %d", ls.Fence(), held.Fence())
			stillTrusted := held.Err() == nil
			require.False(t, stillTrusted, "a trusts job after b claimed it")
			break
		}
		require.ErrorIs(t, err, pglease.ErrHeld)
		time.Sleep(20 * time.Millisecond)
	}
	require.NoError(t, blocker.Rollback(ctx))
	err = <-claimed
	t.Logf("re-entrant claim of the locked row: %v; job lease: %v", err, held.Err())
}

// Guarantee: Close holds nothing and has nothing in flight when it returns,
// also when an Unlock began just before it: Close leaves that lease's
// release to the Unlock, and must wait for it, or the caller who closes its
// pool once Close returned leaves the row live for a whole TTL.
func TestCloseWaitsForAnUnlockInFlight(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	apool := pgtest.Pool(t, nil)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	faulty := pgtest.NewFaultyDB(apool)
	a := pgtest.Locker(t, faulty, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(3*time.Second))
	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)

	release := faulty.Hold("release")
	unlocked := make(chan error, 1)
	go func() { unlocked <- lease.Unlock(ctx) }()
	<-faulty.Entered
	closed := make(chan error, 1)
	go func() { closed <- a.Close(ctx) }()
	select {
	case err := <-closed:
		row, _ := pgtest.ReadRow(t, pool, table, "job")
		t.Logf("Close returned (%v) with the Unlock still in flight; row %+v", err, row)
		apool.Close() // what a caller does once Close returned
		release()
		t.Logf("Unlock: %v", <-unlocked)
		requireNoLiveRowOf(t, pool, table, "a", 0, "job")
	case <-time.After(time.Second):
		release() // Close waits for the Unlock: it must then return
		require.NoError(t, <-unlocked)
		require.NoError(t, <-closed)
		requireNoLiveRowOf(t, pool, table, "a", 0, "job")
	}
}
