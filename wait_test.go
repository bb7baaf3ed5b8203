package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
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

// claimWaitAsync starts l.ClaimWait(ctx, key) and returns its outcome.
func claimWaitAsync(ctx context.Context, l *pglease.Locker, key string) <-chan claimResult {
	out := make(chan claimResult, 1)
	go func() {
		lease, err := l.ClaimWait(ctx, key)
		out <- claimResult{lease, err}
	}()
	return out
}

type claimResult struct {
	lease *pglease.Lease
	err   error
}

func receive(t *testing.T, ch <-chan claimResult, limit time.Duration) claimResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(limit):
		t.Fatalf("waiting claim still waiting after %v", limit)
	}
	return claimResult{}
}

// holdAndWait has holder claim "job", then starts waiter's ClaimWait of
// it: the key's lease, and the outcome of the waiting claim.
func holdAndWait(ctx context.Context, t *testing.T, holder, waiter *pglease.Locker) (*pglease.Lease, <-chan claimResult) {
	t.Helper()
	held, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	return held, claimWaitAsync(ctx, waiter, "job")
}

// parkedWait is a lease table where Locker "holder" holds "job" while
// Locker "waiter", its events recorded, has a ClaimWait of it parked,
// listening for the release.
type parkedWait struct {
	ctx            context.Context
	pool           *pgxpool.Pool
	table          string
	events         *pgtest.Events
	holder, waiter *pglease.Locker
	held           *pglease.Lease     // the holder's lease of "job"
	got            <-chan claimResult // the outcome of the waiter's ClaimWait
}

func parkWaiter(t *testing.T) parkedWait {
	t.Helper()
	w := parkedWait{events: pgtest.NewEvents(t)}
	w.ctx, w.pool, w.table = pgtest.Setup(t)
	w.holder = pgtest.Locker(t, w.pool, w.table, "holder")
	w.waiter = pgtest.Locker(t, w.pool, w.table, "waiter", pglease.WithHook(w.events.Hook))
	w.held, w.got = holdAndWait(w.ctx, t, w.holder, w.waiter)
	w.events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	waitingOn(t, w.waiter, w.events, "job", 1)
	return w
}

// release has the holder release "job" and returns the outcome of the
// waiter's claim, which must come within limit.
func (w parkedWait) release(t *testing.T, limit time.Duration) claimResult {
	t.Helper()
	require.NoError(t, w.held.Unlock(w.ctx))
	return receive(t, w.got, limit)
}

// waitingOn waits until l has a claim of key parked after finding it held.
func waitingOn(t *testing.T, l *pglease.Locker, events *pgtest.Events, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return pglease.Waiters(l, key) >= n && events.Count(pglease.EventContended) >= 1
	}, 10*time.Second, 2*time.Millisecond, "waiters parked")
}

// TestClaimWait pins ClaimWait: it wakes on a release's notification (or
// polls where it cannot listen), takes the key one waiter at a time, and
// gives back whatever a claim it abandons may have committed.
func TestClaimWait(t *testing.T) {
	t.Parallel()
	// Guarantee: a waiting claim whose commit's wait for a synchronous
	// standby was cut short (its caller gave up, the server reported
	// success) is no lease, on every kind of DB; its row is given back.
	t.Run("UnreplicatedCommitIsNotALease", func(t *testing.T) {
		t.Parallel()
		ctx, _, pool, table := pgtest.UnreplicatedSetup(t)
		for name, on := range unreplicatedDBs(ctx, t, pool) {
			t.Run(name, func(t *testing.T) {
				l := on.locker(t, table, name, pglease.WithTTL(30*time.Second))
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				lease, err := l.ClaimWait(cctx, name+"-job")
				cancel()
				require.Error(t, err, "a claim whose commit was not replicated was handed out")
				require.ErrorIs(t, err, context.DeadlineExceeded)
				require.Nil(t, lease)
				requireNoLiveRowOf(t, pool, table, name, 5*time.Second, name+"-job")
			})
		}
	})
	t.Run("WakesOnRelease", func(t *testing.T) {
		t.Parallel()
		w := parkWaiter(t)
		mode, reason := w.waiter.WaitMode()
		require.Equal(t, pglease.WaitByNotification, mode, reason)

		// With the default TTL, no expiry and a 5s safety backoff: only the
		// notification can wake it within the bound.
		r := w.release(t, 3*time.Second)
		require.NoError(t, r.err)
		row, _ := pgtest.ReadRow(t, w.pool, w.table, "job")
		require.Equal(t, w.waiter.Holder(), row.Holder)
		require.Equal(t, r.lease.Fence(), row.Fence)
	})

	t.Run("WakesAtExpiry", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook))
		// A holder that crashed: its row lapses in 700ms, and nothing notifies.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, expires_at) VALUES ('job', 'crashed', clock_timestamp() + interval '700 milliseconds')`,
			pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)

		got := claimWaitAsync(ctx, waiter, "job")
		events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		// Woken at the expiry read on the server, well before the 5s backoff.
		r := receive(t, got, 4*time.Second)
		require.NoError(t, r.err)
		require.Equal(t, waiter.Holder(), r.lease.Holder())
	})

	t.Run("WakesAfterTheListenerIsKilled", func(t *testing.T) {
		t.Parallel()
		w := parkWaiter(t)
		pid := pglease.ListenerPID(w.waiter)
		require.NotZero(t, pid)
		_, err := w.pool.Exec(w.ctx, "SELECT pg_terminate_backend($1)", pid)
		require.NoError(t, err)
		w.events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		// Released while nobody listens, or right after the new LISTEN: either
		// way the waiter takes the key within the bound.
		r := w.release(t, 4*time.Second)
		require.NoError(t, r.err)
		w.events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		require.NotEqual(t, pid, pglease.ListenerPID(w.waiter), "listening again on a new connection")

		// And it still wakes by notification.
		got := claimWaitAsync(w.ctx, w.holder, "job")
		require.NoError(t, r.lease.Unlock(w.ctx))
		require.NoError(t, receive(t, got, 4*time.Second).err)
	})

	t.Run("ReleaseNotifiesTheKey", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{pglease.ChannelFor(table)}.Sanitize())
		require.NoError(t, err)

		l := pgtest.Locker(t, pool, table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		n, err := conn.WaitForNotification(wctx)
		require.NoError(t, err, "the release notified nothing")
		require.Equal(t, "job", n.Payload)

		// A release that finds a later mandate's row releases nothing and
		// notifies nothing.
		stale, err := l.Claim(ctx, "job2")
		require.NoError(t, err)
		_, err = l.Claim(ctx, "job2") // re-entrant: stale is lost
		require.NoError(t, err)
		require.ErrorIs(t, stale.Unlock(ctx), pglease.ErrLost)
		wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		n, err = conn.WaitForNotification(wctx)
		require.Error(t, err, "notified %v for a release that released nothing", n)
	})

	t.Run("ChannelNamesFitAndStayDistinct", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		names := []string{
			"lease", `we"ird`, "with space", "ünïcödé_tåble", "public.lease",
			strings.Repeat("a", 63), strings.Repeat("a", 62) + "b", "s." + strings.Repeat("t", 63),
			strings.Repeat("é", 31) + "x", strings.Repeat("ü", 40) + "." + strings.Repeat("ö", 31),
			`"; DROP TABLE x; --`,
		}
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		seen := map[string]string{}
		for _, name := range names {
			ch := pglease.ChannelFor(name)
			require.LessOrEqual(t, len(ch), 63, "channel of %q", name)
			require.Equal(t, ch, pglease.ChannelFor(name), "stable")
			if other, dup := seen[ch]; dup {
				t.Fatalf("tables %q and %q share channel %q", name, other, ch)
			}
			seen[ch] = name
			// LISTEN takes it as an identifier, pg_notify as text: both must
			// name the same channel, which a truncation would break.
			_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
			require.NoError(t, err, "LISTEN %q", ch)
			_, err = conn.Exec(ctx, "SELECT pg_notify($1, 'k')", ch)
			require.NoError(t, err, "pg_notify %q", ch)
			n, err := conn.WaitForNotification(ctx)
			require.NoError(t, err)
			require.Equal(t, ch, n.Channel)
			_, err = conn.Exec(ctx, "UNLISTEN *")
			require.NoError(t, err)
		}
	})

	// Guarantee: with nobody waiting, Claim and Unlock send one statement
	// each, as before waiting claims existed.
	t.Run("NoExtraStatementWithoutWaiters", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		l := pgtest.Locker(t, pool, table, "one")
		counter.Reset()
		const n = 20
		for i := range n {
			lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
			require.NoError(t, err)
			require.NoError(t, lease.Unlock(ctx))
		}
		require.Equal(t, n, counter.Count("claim"))
		require.Equal(t, n, counter.Count("release"))
		require.Zero(t, counter.Count("other"), "statements other than claim and release")
		mode, _ := l.WaitMode()
		require.Equal(t, pglease.WaitIdle, mode, "a listener started without a waiter")
	})

	t.Run("PollsThroughPgBouncer", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
		pool := bouncedPool(t, b, pgx.QueryExecModeExec)
		table := pgtest.Table(t, pool)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook))

		held, got := holdAndWait(ctx, t, holder, waiter)
		ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		for ev.Err == nil || !strings.Contains(ev.Err.Error(), "probe") {
			ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		}
		mode, reason := waiter.WaitMode()
		require.Equal(t, pglease.WaitByPolling, mode)
		require.Contains(t, reason, "did not arrive")
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 5*time.Second)
		require.NoError(t, r.err)
		require.Equal(t, waiter.Holder(), r.lease.Holder())
	})

	t.Run("PollsOnADBThatIsNotAPool", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pgtest.NewFaultyDB(pool), table, "waiter")
		held, got := holdAndWait(ctx, t, holder, waiter)
		require.Eventually(t, func() bool { m, _ := waiter.WaitMode(); return m == pglease.WaitByPolling }, 5*time.Second, 2*time.Millisecond, "polling")
		_, reason := waiter.WaitMode()
		require.Contains(t, reason, "not a *pgxpool.Pool")
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, 5*time.Second).err)
	})

	t.Run("OneClaimPerRelease", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		counter := &pgtest.Statements{}
		pool := pgtest.Pool(t, nil)
		table := pgtest.Table(t, pool)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pgtest.Pool(t, counter), table, "waiter", pglease.WithHook(events.Hook))

		held, err := holder.Claim(ctx, "job")
		require.NoError(t, err)
		const n = 8
		results := make(chan claimResult, n)
		for range n {
			go func() {
				lease, err := waiter.ClaimWait(ctx, "job")
				results <- claimResult{lease, err}
			}()
		}
		events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		events.WaitFor(t, pglease.EventContended, 10*time.Second) // the retry after LISTEN
		waitingOn(t, waiter, events, "job", n)
		counter.Reset()
		require.NoError(t, held.Unlock(ctx))

		// Each winner holds the key alone; its Unlock hands it to the next.
		for i := range n {
			r := receive(t, results, 10*time.Second)
			require.NoError(t, r.err)
			_, ok := waiter.Held("job")
			require.True(t, ok)
			select {
			case other := <-results:
				t.Fatalf("two waiters hold the key at once: fences %d and %d", r.lease.Fence(), other.lease.Fence())
			case <-time.After(20 * time.Millisecond):
			}
			// One claim per release; a herd would be one per waiter (n). A
			// waiter whose safety pause (2.5s to 5s) ends on its own on a
			// loaded machine may add one: two are allowed for the whole run.
			claims := counter.Count("claim")
			assert.LessOrEqual(t, claims, i+1+2, "claim statements for %d releases", i+1)
			require.NoError(t, r.lease.Unlock(ctx))
		}
		t.Logf("claim statements for %d waiters: %d", n, counter.Count("claim"))
	})

	t.Run("SeveralLockersTakeTurns", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const lockers, each = 3, 3
		var holding atomic.Int32
		var wg sync.WaitGroup
		errs := make(chan error, lockers*each)
		wins := atomic.Int32{}
		for i := range lockers {
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("l%d", i))
			for range each {
				wg.Go(func() {
					lease, err := l.ClaimWait(ctx, "job")
					if err != nil {
						errs <- err
						return
					}
					if holding.Add(1) != 1 {
						errs <- errors.New("two holders at once")
					}
					wins.Add(1)
					time.Sleep(5 * time.Millisecond) // the work done under the lease
					holding.Add(-1)
					if err := lease.Unlock(ctx); err != nil {
						errs <- err
					}
				})
			}
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
		require.EqualValues(t, lockers*each, wins.Load())
	})

	t.Run("SparesItsOwnLockersLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "one")
		first, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		_, err = l.ClaimWait(wctx, "job")
		cancel()
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.NoError(t, first.Err(), "a waiting claim took over the Locker's own lease")

		got := claimWaitAsync(ctx, l, "job")
		require.NoError(t, first.Unlock(ctx))
		r := receive(t, got, 2*time.Second)
		require.NoError(t, r.err)
		require.Greater(t, r.lease.Fence(), first.Fence())
	})

	t.Run("GivingUpLeavesNoLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pool, table, "waiter")

		// Given up while held: ErrHeld and the context's error, nothing
		// claimed. A second leaves the first claim (a table check, a new
		// backend planning the statement) time to learn the key is held.
		_, err := holder.Claim(ctx, "job")
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = waiter.ClaimWait(wctx, "job")
		cancel()
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		// Deadlines that end around the release: whatever the outcome, the
		// waiter holds the key if and only if it returned a lease.
		for i := range 30 {
			key := fmt.Sprintf("race-%d", i)
			held, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			wctx, cancel := context.WithTimeout(ctx, time.Duration(20+i)*time.Millisecond)
			got := claimWaitAsync(wctx, waiter, key)
			time.Sleep(20 * time.Millisecond) // spreads the release around the deadline
			require.NoError(t, held.Unlock(ctx))
			r := receive(t, got, 5*time.Second)
			cancel()
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			if r.err == nil {
				require.Equal(t, waiter.Holder(), row.Holder)
				require.True(t, row.Live)
				require.NoError(t, r.lease.Unlock(ctx))
				continue
			}
			require.ErrorIs(t, r.err, context.DeadlineExceeded)
			_, ok = waiter.Held(key)
			require.False(t, ok, "the waiter gave up but holds %q", key)
			require.False(t, row.Live && row.Holder == waiter.Holder(), "the waiter gave up (%v) but its row is live: %+v", r.err, row)
		}
	})

	// Guarantee: a waiter never leaves a live row for a key it did not return a
	// lease for, whatever ended its claim: here the server committed it and the
	// connection reset before the reply. Left live, the row would lock every
	// other Locker's waiter out until its TTL, with nobody holding the key.
	t.Run("LostReplyLeavesNoLiveRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		db := &lostReplyDB{DB: pool, lost: make(chan struct{})}
		waiter := pgtest.Locker(t, db, table, "waiter", pglease.WithHook(events.Hook))
		// Each claim its own statement, whose reply is lost whether it is
		// sent by QueryRow or, as a burst of one, by Query.
		pglease.SetCoalescing(waiter, false)

		held, got := holdAndWait(ctx, t, holder, waiter)
		waitingOn(t, waiter, events, "job", 1)
		db.armed.Store(true)
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 5*time.Second)
		select {
		case <-db.lost:
		case <-time.After(5 * time.Second):
			t.Fatalf("the waiter's claim after the release was not the one whose reply was lost: ClaimWait returned %v", r.err)
		}
		require.Error(t, r.err, "the reply was lost: ClaimWait cannot have a lease")
		t.Logf("ClaimWait returned: %v", r.err)

		_, ok := waiter.Held("job")
		require.False(t, ok)
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		require.False(t, row.Live && row.Holder == waiter.Holder(),
			"ClaimWait returned an error but left a live row under its holder, held by nobody until %v: %+v", row.ExpiresAt, row)
	})

	// The same guarantee, without any fault: a claim that waited on a row lock (an
	// operator's transaction) for longer than the trust window but less than
	// the TTL commits a live row, and Claim answers ErrLost ("took longer than
	// the trust window"). ClaimWait must then either give the row back and
	// return an error, or claim again and return the lease it holds: never
	// leave a live row under its holder that nobody holds.
	t.Run("OutwaitedTrustWindowLeavesNoLiveRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = 4 * time.Second // trust window 3.6s
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithTTL(ttl), pglease.WithTimeout(10*time.Second))
		tbl := pgx.Identifier{table}.Sanitize()

		// An expired row of a former holder, locked by an open transaction.
		_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		VALUES ('job', 'old', clock_timestamp() - interval '2 s', clock_timestamp() - interval '1 s')`, tbl))
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR UPDATE`, tbl))
		require.NoError(t, err)

		got := claimWaitAsync(ctx, waiter, "job")
		require.Eventually(t, func() bool {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'`+" AND query LIKE '%"+table+"%'").Scan(&n))
			return n == 1
		}, 5*time.Second, 10*time.Millisecond, "the waiter's claim waits on the row lock")
		// The scenario: the lock is held 3.8s, past the trust window (3.6s)
		// and within the TTL.
		time.Sleep(ttl - ttl/20)
		require.NoError(t, tx.Commit(ctx))
		r := receive(t, got, 10*time.Second)
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		if r.err == nil {
			// Back within the trust window, or given back and claimed again:
			// the live row is the lease ClaimWait returned.
			require.Equal(t, r.lease.Fence(), row.Fence, "the row is the lease ClaimWait returned")
			require.True(t, row.Live)
			require.NoError(t, r.lease.Unlock(ctx))
			return
		}
		t.Logf("ClaimWait returned: %v", r.err)
		require.False(t, row.Live && row.Holder == waiter.Holder(),
			"ClaimWait returned an error but left a live row under its holder, held by nobody: %+v", row)
	})

	// Guarantee: the give-back of a waiting claim whose outcome it never learned
	// acts on exactly the mandate that claim made, however late it reaches the
	// server: here the claim's reply is lost after its commit, the give-back
	// is held up on the network until the Locker has claimed the key again, and
	// it arrives then. It must leave the newer lease's row alone: expired, the
	// key would go to another replica while this Locker still holds it.
	t.Run("LateGiveBackSparesANewerLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(10*time.Second), pglease.WithTimeout(2*time.Second))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(10*time.Second))
		pglease.SetCoalescing(a, false)

		claim := wire.Arm(pgtest.Kind("claim"), pgtest.LoseReply)
		// Whatever gives the row back (a write that is not a claim) is held up.
		giveBack := wire.Arm(func(sql string) bool {
			return pgtest.StatementKind(sql) != "claim" && strings.Contains(sql, "UPDATE")
		}, pgtest.DeliverLate)
		_, err := a.ClaimWait(ctx, "job")
		require.Error(t, err, "the claim's reply was lost")
		<-claim.Ran

		newer, err := a.Claim(ctx, "job")
		require.NoError(t, err, "a claims the key again")
		select {
		case <-giveBack.Hit:
			giveBack.Deliver()
			<-giveBack.Ran
		default:
			t.Log("no give-back was sent: the orphaned row lapses at its expiry")
		}

		_, err = b.Claim(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld, "b took the key while a holds fence %d", newer.Fence())
		_, held := a.Held("job")
		require.True(t, held)
		row, _ := pgtest.ReadRow(t, pool, table, "job")
		require.Equal(t, newer.Fence(), row.Fence)
		require.True(t, row.Live)
	})

	// Guarantee: a waiting claim that fails gives back what its claim may have
	// committed on the terms that claim was made on, the Locker's own: not the
	// longest min hold of any job of the Locker, which would keep the key from
	// every replica for that long.
	t.Run("GiveBackKeepsOnlyItsOwnMinHold", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second))
		_, err := a.Job(pglease.WithTTL(30*time.Second), pglease.WithMinHold(20*time.Second))
		require.NoError(t, err)
		b := pgtest.Locker(t, pool, table, "b")
		pglease.SetCoalescing(a, false)

		claim := wire.Arm(pgtest.Kind("claim"), pgtest.LoseReply)
		_, err = a.ClaimWait(ctx, "job")
		require.Error(t, err)
		<-claim.Ran

		lease, err := b.Claim(ctx, "job")
		require.NoError(t, err, "the given-back key stays held by nobody")
		require.NoError(t, lease.Unlock(ctx))
	})

	// Guarantee: a released lease stays held until acquired_at + its min hold,
	// so that a replica whose scheduler fires later cannot run the same tick,
	// even when a ClaimWait of the same key fails and gives back what its claim
	// may have committed. A job's released row whose min hold equals the
	// Locker's TTL looks exactly like an unreleased claim of the Locker's TTL
	// (expires_at = acquired_at + that duration); its give-back must keep the
	// job's min hold.
	t.Run("GiveBackKeepsAJobsMinHold", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Table(t, pool)
		faulty := pgtest.NewFaultyDB(pool)

		l := pgtest.Locker(t, faulty, table, "a", pglease.WithTTL(3*time.Second))
		job, err := l.Job(pglease.WithTTL(6*time.Second), pglease.WithMinHold(3*time.Second))
		require.NoError(t, err)

		lease, err := job.Claim(ctx, "tick")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		before, ok := pgtest.ReadRow(t, pool, table, "tick")
		require.True(t, ok)
		require.True(t, before.Live, "the released job lease is kept for its min hold")
		require.Equal(t, before.AcquiredAt.Add(3*time.Second), before.ExpiresAt)

		faulty.SetFail("claim", errors.New("connection reset by peer"))
		_, err = l.ClaimWait(ctx, "tick")
		require.Error(t, err)
		faulty.SetFail("claim", nil)

		after, ok := pgtest.ReadRow(t, pool, table, "tick")
		require.True(t, ok)
		require.Equal(t, before.ExpiresAt, after.ExpiresAt,
			"a ClaimWait whose claim wrote nothing changed the released job lease's expiry (min hold cut by %v)", before.ExpiresAt.Sub(after.ExpiresAt))

		other := pgtest.Locker(t, pool, table, "b")
		_, err = other.Claim(ctx, "tick")
		require.ErrorIs(t, err, pglease.ErrHeld, "another replica took the tick within the job's min hold")
	})

	t.Run("CloseEndsItWithErrClosed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("waiter"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook)))
		_, err := holder.Claim(ctx, "job")
		require.NoError(t, err)
		var outs []<-chan claimResult
		for range 3 {
			outs = append(outs, claimWaitAsync(ctx, waiter, "job"))
		}
		events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		waitingOn(t, waiter, events, "job", 3)
		require.NoError(t, waiter.Close(ctx))
		for _, out := range outs {
			r := receive(t, out, 2*time.Second)
			require.ErrorIs(t, r.err, pglease.ErrClosed)
		}
		_, err = waiter.ClaimWait(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrClosed)
	})

	// Guarantee: the pool closed before the Locker, with a claim waiting and
	// the listener on a hijacked connection: neither Close hangs, the waiter
	// ends, and goleak (TestMain) finds nothing left.
	t.Run("PoolClosedFirstDoesNotHang", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		wpool := pgtest.Pool(t, nil)
		waiter := pgtest.Each(pglease.NewLocker(wpool, pglease.WithTable(table), pglease.WithHolder("waiter"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook)))
		_, got := holdAndWait(ctx, t, holder, waiter)
		events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		waitingOn(t, waiter, events, "job", 1)

		poolClosed := make(chan struct{})
		go func() { wpool.Close(); close(poolClosed) }()
		select {
		case <-poolClosed:
		case <-time.After(5 * time.Second):
			t.Fatal("pool.Close hangs with a Locker's waiter and listener on it")
		}
		closed := make(chan error, 1)
		go func() { closed <- waiter.Close(ctx) }()
		select {
		case err := <-closed:
			t.Logf("Close after the pool closed: %v", err) // its releases could not be sent
		case <-time.After(5 * time.Second):
			t.Fatal("Locker.Close hangs after its pool was closed")
		}
		r := receive(t, got, 5*time.Second)
		require.Error(t, r.err)
		t.Logf("waiter ended with: %v", r.err)
	})
}

// lostReplyDB runs every statement for real, but once armed, the next
// claim statement's reply is lost after the server has run (and committed)
// it: what a connection reset between the commit and the reply does.
type lostReplyDB struct {
	pglease.DB
	armed atomic.Bool
	lost  chan struct{}
}

type lostReplyRow struct {
	pgx.Row
	db *lostReplyDB
}

func (r lostReplyRow) Scan(dest ...any) error {
	if err := r.Row.Scan(dest...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			r.db.armed.Store(true) // a claim that lost wrote nothing: the next one's reply is lost
		}
		return err
	}
	close(r.db.lost)
	return errors.New("read tcp: connection reset by peer (the reply of a committed claim was lost)")
}

// Query loses the reply of an armed claim sent by Query (a burst of one, as
// a claim on a DB that is not a pool is sent): the statement runs to its
// end, and a claim that took a row reads as a connection reset.
func (d *lostReplyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pgtest.StatementKind(sql) != "claim" || !d.armed.CompareAndSwap(true, false) {
		return d.DB.Query(ctx, sql, args...)
	}
	rows, err := d.DB.Query(ctx, sql, args...)
	if err != nil {
		return nil, err
	}
	took := 0
	for rows.Next() {
		took++
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return nil, err
	}
	if took == 0 {
		d.armed.Store(true) // a claim that lost wrote nothing: the next one's reply is lost
		return d.DB.Query(ctx, `SELECT 1 WHERE false`)
	}
	close(d.lost)
	return nil, errors.New("read tcp: connection reset by peer (the reply of a committed claim was lost)")
}

func (d *lostReplyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := d.DB.QueryRow(ctx, sql, args...)
	if pgtest.StatementKind(sql) == "claim" && d.armed.CompareAndSwap(true, false) {
		return lostReplyRow{row, d}
	}
	return row
}
