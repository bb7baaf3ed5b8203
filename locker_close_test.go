package pglease_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/url"
	"runtime/pprof"
	"slices"
	"strconv"
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
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// liveRows counts the rows of table that are live now.
func liveRows(t *testing.T, db pglease.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT count(*) FROM %s WHERE expires_at > clock_timestamp()`, pgx.Identifier{table}.Sanitize())).Scan(&n))
	return n
}

// labelled returns the goroutines that carry the profiler label
// pglease_test=id (pprof.Do), each record with its stack: those that ran
// under it, and every goroutine they started (and so on).
func labelled(id string) (n int, stacks string) {
	var b bytes.Buffer
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	want := fmt.Sprintf("%q:%q", "pglease_test", id)
	for _, rec := range strings.Split(b.String(), "\n\n") {
		head, rest, _ := strings.Cut(rec, "\n")
		c, _, ok := strings.Cut(head, " @ ")
		if !ok || !strings.HasPrefix(rest, "# labels: ") || !strings.Contains(strings.SplitN(rest, "\n", 2)[0], want) {
			continue
		}
		k, _ := strconv.Atoi(c)
		n += k
		stacks += rec + "\n\n"
	}
	return n, stacks
}

// onlyCleanup reports whether stacks, as labelled returns them, are all
// pgx's clean-up of a closed connection: its goroutine sending a cancel
// request and a Terminate (asyncClose), or the pool's destruction of the
// connection, which waits for that.
func onlyCleanup(stacks string) bool {
	for _, rec := range strings.Split(stacks, "\n\n") {
		if strings.TrimSpace(rec) == "" {
			continue
		}
		cleanup := strings.Contains(rec, "pgconn.(*PgConn).asyncClose") ||
			strings.Contains(rec, "pgxpool.NewWithConfig") && strings.Contains(rec, "destructResourceValue")
		if !cleanup {
			return false
		}
	}
	return true
}

// TestClose pins Close: it releases what is held within its timeout,
// whatever else holds row locks, and leaves nothing in flight behind it.
func TestClose(t *testing.T) {
	t.Parallel()
	// Guarantee: Close's release of many leases settles the rows it found
	// locked in later statements, each lease by its own row's outcome
	// (revoked, taken or released while it waited), and Close returns nil.
	t.Run("SettlesLockedRowsByTheirOwnOutcomes", testCloseSettlesLockedRowsByTheirOwnOutcomes)
	t.Run("ReleasesAThousandOverASlowNetwork", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		proxy := pgtest.Proxy(t, "")
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
	})

	t.Run("KeepsTheMinHold", func(t *testing.T) {
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
				// A claim of the same holder that a never saw (another Locker
				// storing its holder) takes "taken" with a new mandate before
				// a closes.
				next, err := pgtest.Locker(t, pool, table, "a", append(opts, pglease.StoredHolder(a.Holder()))...).Claim(ctx, "taken")
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
	})

	// Guarantee: Close holds nothing and has nothing in flight when it returns,
	// also when an Unlock began just before it: Close leaves that lease's
	// release to the Unlock, and must wait for it, or the caller who closes its
	// pool once Close returned leaves the row live for a whole TTL. So also
	// when the key has a second release besides (the lease that superseded
	// the one unlocking, released by Close or unlocked too): Close waits for
	// each release, not one per key.
	for _, second := range []string{"None", "ByClose", "ByUnlock"} {
		t.Run("WaitsForAnUnlockInFlight/SecondRelease="+second, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			held := &releaseHold{entered: make(chan struct{}), open: make(chan struct{})}
			apool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = held })
			pool := pgtest.Pool(t, nil)
			table := pgtest.Table(t, pool)
			a := pgtest.Locker(t, apool, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(3*time.Second))
			lease, err := a.Claim(ctx, "job")
			require.NoError(t, err)
			var newer *pglease.Lease
			if second != "None" {
				newer, err = a.Claim(ctx, "job") // re-entrant: lease is superseded
				require.NoError(t, err)
				require.ErrorIs(t, lease.Err(), pglease.ErrLost)
			}

			release := held.hold(lease.Fence())
			unlocked := make(chan error, 1)
			go func() { unlocked <- lease.Unlock(ctx) }()
			<-held.entered
			if second == "ByUnlock" {
				require.NoError(t, newer.Unlock(ctx))
			}
			closed := make(chan error, 1)
			go func() { closed <- a.Close(ctx) }()
			select {
			case err := <-closed:
				apool.Close() // what a caller does once Close returned
				release()
				t.Errorf("Close returned (%v) with an Unlock still in flight, which returned %v after it", err, <-unlocked)
			case <-time.After(time.Second):
				release() // Close waits for the Unlock: it must then return
				err := <-unlocked
				if second == "None" {
					require.NoError(t, err)
				} else {
					require.ErrorIs(t, err, pglease.ErrLost, "the superseded lease's Unlock")
				}
				require.NoError(t, <-closed)
			}
			requireNoLiveRowOf(t, pool, table, "a", 0, "job")
		})
	}

	// Guarantee: Close ends a waiting claim whose statement is in flight, waits
	// for it, and leaves no live row of it.
	t.Run("EndsAWaitingClaimInFlight", func(t *testing.T) {
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
	})

	// Guarantee: Close holds nothing and has nothing in flight when it returns,
	// even when the claims it ends were queued in a burst whose statement had
	// already left: the statement commits, its reply never reaches a caller.
	t.Run("EndsABurstInFlight", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

		keys := []string{"k1", "k2"}
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		send := pglease.PrepareClaimBurst([]context.Context{ctx, ctx}, l, keys)
		out := make(chan []error, 1)
		go func() {
			_, errs := send()
			out <- errs
		}()
		<-claim.Hit

		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		select {
		case err := <-closed:
			t.Logf("Close: %v", err)
		case <-time.After(15 * time.Second):
			t.Fatal("Close did not return within 15s")
		}
		errs := <-out
		for i, err := range errs {
			require.Error(t, err, "claim of %q", keys[i])
			t.Logf("claim of %q: %v", keys[i], err)
		}
		requireNoLiveRowOf(t, pool, table, "a", 0, keys...)
	})

	// Guarantee: Close given a context that has already ended still expires
	// what the claims it ended may have written: a burst's reply is held back
	// on a pool's connection while Close ends its claims, which are handed
	// to the coalescer, and their rows given back once it returns.
	t.Run("GivesBackWhatClaimsItEndedWroteThoughItsContextEnded", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, l, out := burstInFlightAtClose(t, "")
		for _, key := range []string{"k1", "k2"} {
			require.Eventually(t, func() bool { _, ok := pgtest.ReadRow(t, pool, table, key); return ok },
				5*time.Second, time.Millisecond, "the burst's claims commit")
		}
		ended, cancel := context.WithCancel(ctx)
		cancel()
		require.NoError(t, l.Close(ended), "Close expired again what its claims wrote")
		requireEndedByClose(t, <-out)
		requireNoLiveRowOf(t, pool, table, "a", 0, "k1", "k2")
	})

	// Guarantee: Close names nothing of claims answered after it ended
	// them: the burst's reply, read after Close's cancel, is of unknown
	// outcome only to a failover, and the give-back's read after it finds
	// every row the claims wrote; here none, the keys being held.
	t.Run("NamesNothingOfClaimsAnsweredAfterItEndedThem", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, l, out := burstInFlightAtClose(t, "b")
		require.NoError(t, l.Close(ctx), "the claims found their keys held and wrote nothing")
		requireEndedByClose(t, <-out)
		for _, key := range []string{"k1", "k2"} {
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.True(t, row.Live && strings.HasPrefix(row.Holder, "b#"), "%s stays held by its holder: %+v", key, row)
		}
	})

	// Guarantee: Close returns nil only when it left no row of its holder
	// live: a row another transaction locks while Close gives it back lapses
	// at its expiry, and Close names it.
	t.Run("NamesARowItCouldNotGiveBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, l, out := burstInFlightAtClose(t, "")
		require.Eventually(t, func() bool { _, ok := pgtest.ReadRow(t, pool, table, "k1"); return ok },
			5*time.Second, time.Millisecond, "the burst's claims commit")
		unlock := pgtest.LockRow(t, pool, table, "k1")
		err := l.Close(ctx)
		unlock(false)
		require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
		require.ErrorContains(t, err, "locked by another transaction")
		requireEndedByClose(t, <-out)
		requireNoLiveRowOf(t, pool, table, "a", 0, "k2")
	})

	// Guarantee: Close names nothing of claims whose cancels the server
	// answered: waiting on row locks another transaction holds, on a pool,
	// each is cancelled and rolls back, and Close returns nil. One claim
	// alone, and three at once.
	for _, n := range []int{1, 3} {
		t.Run(fmt.Sprintf("NamesNothingOf%dClaimsWhoseCancelsWereAnswered", n), func(t *testing.T) {
			t.Parallel()
			ctx, admin, table := pgtest.Setup(t)
			x := pgtest.Locker(t, admin, table, "x", pglease.WithTTL(time.Minute))
			keys := []string{"k1", "k2", "k3"}[:n]
			for _, k := range keys {
				ls, err := x.Claim(ctx, k)
				require.NoError(t, err)
				require.NoError(t, ls.Unlock(ctx))
			}
			tx := pgtest.LockRows(t, admin, table, "true")
			l := pgtest.Locker(t, pgtest.Pool(t, nil), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(2*time.Second))
			require.NoError(t, l.CheckTable(ctx))
			out := make(chan error, n)
			for _, k := range keys {
				go func() { _, err := l.Claim(ctx, k); out <- err }()
			}
			require.Eventually(t, func() bool { return lockWaiters(t, admin, table) >= n }, 10*time.Second, 5*time.Millisecond,
				"the claims wait on the row locks")
			require.NoError(t, l.Close(ctx), "the server answered every cancel: nothing can be left behind")
			for range keys {
				require.ErrorIs(t, <-out, pglease.ErrClosed)
			}
			require.NoError(t, tx.Rollback(ctx))
			for _, k := range keys {
				row, ok := pgtest.ReadRow(t, admin, table, k)
				require.True(t, ok && row.Holder == x.Holder(), "the claim wrote nothing: %+v", row)
			}
		})
	}

	// Guarantee: Close given a context that has already ended returns
	// within its bound (the Locker's timeout, and a cancelled claim's end
	// within 2s plus its timeout) though a burst's claims it ended are
	// given back one after the other by the coalescer, each read waiting on
	// a row lock: together, not each, they get that bound, and what they
	// could not read is named.
	t.Run("GivesBackABurstWithinItsBoundThoughItsContextEnded", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		const n, timeout = 12, 2 * time.Second
		x := pgtest.Locker(t, admin, table, "x", pglease.WithTTL(time.Minute))
		keys, ctxs := make([]string, n), make([]context.Context, n)
		for i := range keys {
			keys[i], ctxs[i] = fmt.Sprintf("k%d", i), ctx
			ls, err := x.Claim(ctx, keys[i])
			require.NoError(t, err)
			require.NoError(t, ls.Unlock(ctx))
		}
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, holdPool(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(timeout))
		require.NoError(t, l.CheckTable(ctx))
		send := pglease.PrepareClaimBurst(ctxs, l, keys)
		hold.Arm()
		out := make(chan []error, 1)
		go func() { _, errs := send(); out <- errs }()
		requireHeld(t, hold)
		pgtest.LockRows(t, admin, table, "true")
		ended, cancel := context.WithCancel(ctx)
		cancel()
		start := time.Now()
		err := l.Close(ended)
		took := time.Since(start)
		for i, err := range <-out {
			require.ErrorIs(t, err, pglease.ErrClosed, keys[i])
		}
		bound := timeout + 2*time.Second + timeout + time.Second // one each in turn would take n*timeout/2
		require.Less(t, took, bound, "Close with an ended context took %v, past its bound: %v", took, err)
		for _, k := range keys {
			require.ErrorContains(t, err, fmt.Sprintf("claim %q may have written a row", k))
		}
		hold.Deliver()
	})

	// Guarantee: an Elector's callback may call the Locker's Close while the
	// Locker closes: the Close it runs waits for that callback, so the
	// callback's Close returns at once, and both return nil.
	t.Run("ReturnsThoughAnElectorsCallbackClosesItToo", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(time.Second))
		inner := make(chan error, 1)
		el, err := pglease.NewElector(l, "e", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStoppedLeading: func(*pglease.Lease) {
				cctx, cancel := context.WithTimeout(context.Background(), 5*time.Second) // bounds the test had it to wait
				defer cancel()
				inner <- l.Close(cctx)
			},
		}))
		require.NoError(t, err)
		_, err = el.Campaign(ctx)
		require.NoError(t, err)
		require.NoError(t, l.Close(ctx))
		inside := <-inner
		require.ErrorIs(t, inside, pglease.ErrClosed, "the callback's Close cannot wait for the first, and never says nil for it")
		require.ErrorContains(t, inside, "called from an Elector's callback")
		requireNoLiveRowOf(t, pool, table, "a", 0, "e")
	})

	// Guarantee: a Close after the first waits for the first, and for the
	// Electors' callbacks, which a first Close called from one of them
	// cannot wait for, and returns the first's error: when it returns nil,
	// nothing of the Locker runs. The first Close is kept running a moment
	// by a lease whose row another transaction locks.
	t.Run("ALaterCloseWaitsForTheCallbacksOfAnElectorWhoseCallbackClosedIt", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(2*time.Second))
		_, err := l.Claim(ctx, "k2")
		require.NoError(t, err)
		start, first := make(chan struct{}), make(chan error, 1)
		var stopped atomic.Bool
		el, err := pglease.NewElector(l, "e", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStartedLeading: func(*pglease.Lease) {
				<-start
				first <- l.Close(context.Background())
			},
			OnStoppedLeading: func(*pglease.Lease) {
				time.Sleep(300 * time.Millisecond) // the application's own work
				stopped.Store(true)
			},
		}))
		require.NoError(t, err)
		_, err = el.Campaign(ctx)
		require.NoError(t, err)
		end := pgtest.LockRow(t, pool, table, "k2") // the first Close's release of k2 waits on it
		close(start)
		requireCloseBegun(t, l)
		time.AfterFunc(500*time.Millisecond, func() { end(false) })
		require.NoError(t, l.Close(ctx))
		require.True(t, stopped.Load(), "Close returned nil before the Elector's OnStoppedLeading returned")
		require.NoError(t, <-first)
	})

	// Guarantee: a later Close waits for a callback that does not return
	// for the Locker's timeout, and beyond it as long as its context
	// lasts, then returns an error: never nil, never for ever.
	t.Run("ALaterCloseWaitsForACallbackWithinItsBounds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(300*time.Millisecond))
		start, first, release := make(chan struct{}), make(chan error, 1), make(chan struct{})
		t.Cleanup(func() { close(release) })
		el, err := pglease.NewElector(l, "e", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStartedLeading: func(*pglease.Lease) {
				<-start
				first <- l.Close(context.Background())
				<-release // the application's work, which outlasts the later Close
			},
		}))
		require.NoError(t, err)
		_, err = el.Campaign(ctx)
		require.NoError(t, err)
		close(start)
		require.NoError(t, <-first)
		later := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			defer cancel()
			later <- l.Close(cctx)
		}()
		select {
		case err := <-later:
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.ErrorContains(t, err, "waiting for the callbacks still due")
		case <-time.After(10 * time.Second):
			t.Fatal("a later Close waited for a callback beyond its context and the Locker's timeout")
		}
	})

	// Guarantee: Closes that wait for each other's callbacks end within
	// their bounds: one Elector's callback closes the Locker, which closes
	// a second Elector, whose last callback closes the first Elector.
	t.Run("ClosesFromTwoElectorsCallbacksEndWithinTheirBounds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(300*time.Millisecond))
		var e1 *pglease.Elector
		start := make(chan struct{})
		closes := make(chan error, 2)
		closeWithin := func(close func(context.Context) error) {
			cctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			closes <- close(cctx)
		}
		var err error
		e1, err = pglease.NewElector(l, "e1", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStartedLeading: func(*pglease.Lease) { <-start; closeWithin(l.Close) },
		}))
		require.NoError(t, err)
		e2, err := pglease.NewElector(l, "e2", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStoppedLeading: func(*pglease.Lease) { closeWithin(e1.Close) },
		}))
		require.NoError(t, err)
		_, err = e2.Campaign(ctx)
		require.NoError(t, err)
		_, err = e1.Campaign(ctx)
		require.NoError(t, err)
		close(start)
		var waited []string
		for range 2 {
			select {
			case err := <-closes:
				if err != nil {
					waited = append(waited, err.Error())
				}
			case <-time.After(10 * time.Second):
				t.Fatal("two Closes waiting for each other's callbacks never returned")
			}
		}
		// The first to give up lets the other's callback return.
		require.NotEmpty(t, waited, "neither Close said it gave up waiting")
		require.Contains(t, waited[0], "waiting for the callbacks still due")
		requireNoLiveRowOf(t, pool, table, "a", 0, "e1", "e2")
	})

	// Guarantee: the same on a DB that is not a pool (a caller's wrapper):
	// a give-back that fails is named by Close, which then does not return nil.
	t.Run("NamesAGiveBackThatFailedOnAWrapper", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		faulty := pgtest.NewFaultyDB(pool)
		wire := pgtest.NewWire(t, faulty)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		claimed := make(chan error, 1)
		go func() {
			_, err := l.Claim(ctx, "k1")
			claimed <- err
		}()
		<-claim.Hit
		<-claim.Ran // committed, its reply held
		reset := errors.New("connection reset by peer")
		faulty.SetFail("release", reset)
		faulty.SetFail("other", reset)
		err := l.Close(ctx)
		require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
		require.ErrorIs(t, <-claimed, pglease.ErrClosed)
	})

	// Guarantee: Close returns within its timeout even when many rows are
	// locked by another transaction, and every lease gets exactly one outcome
	// event (EventReleased or EventReleaseFailed), also when Unlock races with
	// Close on the same leases.
	t.Run("ManyLockedRowsEndInTime", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		const timeout = time.Second
		l := pgtest.Locker(t, pool, table, "c", pglease.WithTTL(10*time.Second), pglease.WithTimeout(timeout), pglease.WithHook(events.Hook))
		const n = 200
		leases := make([]*pglease.Lease, n)
		for i := range leases {
			var err error
			leases[i], err = l.Claim(ctx, fmt.Sprintf("k%03d", i))
			require.NoError(t, err)
		}
		// Half the rows are locked by an open transaction.
		pgtest.LockRows(t, pool, table, `key < 'k100'`)

		var wg sync.WaitGroup
		for i := 0; i < n; i += 3 {
			wg.Go(func() { _ = leases[i].Unlock(ctx) })
		}
		start := time.Now()
		_ = l.Close(ctx)
		took := time.Since(start)
		wg.Wait()
		require.Less(t, took, 3*timeout, "Close took %v", took)

		count := map[string]int{}
		for _, ev := range events.All() {
			if ev.Kind == pglease.EventReleased || ev.Kind == pglease.EventReleaseFailed || ev.Kind == pglease.EventLost {
				count[ev.Key]++
			}
		}
		bad := 0
		for _, ls := range leases {
			if count[ls.Key()] != 1 {
				bad++
			}
		}
		t.Logf("figures: Close of %d leases, %d rows locked, ~%d Unlocks racing: took %v; released %d, failed %d, lost %d",
			n, n/2, n/3, took.Round(time.Millisecond), events.Count(pglease.EventReleased), events.Count(pglease.EventReleaseFailed), events.Count(pglease.EventLost))
		require.Zero(t, bad, "leases without exactly one outcome event")
		row, _ := pgtest.ReadRow(t, pool, table, "k150")
		require.False(t, row.Live, "an unlocked row was released")
	})

	// Guarantee: Close releases every held lease in one statement within
	// its timeout. The batched release is a plain UPDATE, which waits on
	// any row lock. One row locked by an operator's open transaction holds
	// the whole statement until Close's timeout cancels it, and every other
	// lease of the Locker stays held on the server until its expiry (a full
	// TTL) instead of being handed over.
	t.Run("OneLockedRowCostsNoOtherRelease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(time.Second))
		const n = 20
		for i := range n {
			_, err := l.Claim(ctx, fmt.Sprintf("k%02d", i))
			require.NoError(t, err)
		}
		end := pgtest.LockRow(t, pool, table, "k00")
		defer end(false)

		start := time.Now()
		err := l.Close(ctx)
		took := time.Since(start)
		var stillHeld []string
		for i := 1; i < n; i++ {
			key := fmt.Sprintf("k%02d", i)
			if row, _ := pgtest.ReadRow(t, pool, table, key); row.Live {
				stillHeld = append(stillHeld, key)
			}
		}
		require.Empty(t, stillHeld, "Close took %v (err %v); rows of unlocked leases still live after Close, held until their expiry (60s)", took, err)
	})

	// Guarantee: Close "releases every lease still held in one statement".
	// With one lease's row held by a guarded transaction for longer than the
	// Locker's timeout, that one statement waits on it and is cancelled: none
	// of the other leases is released, and other replicas wait for their TTL.
	// (The cancelled statement is not gone: pgx drops the connection, but the
	// server keeps it waiting on the row lock, holding the other rows it has
	// already updated, and it lands, unseen, once the guarded transaction ends.)
	t.Run("GuardedRowCostsNoOtherRelease", func(t *testing.T) {
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
	})

	t.Run("NilContextLeavesItClosable", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		// No cleanup Close: if the first Close wedges the Locker, a Close
		// without deadline would hang the test binary.
		l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("h"), pglease.WithLogger(pgtest.Quiet)))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		var nilCtx context.Context
		msg := panicMessage(func() { _ = l.Close(nilCtx) })
		require.Contains(t, strings.ToLower(msg), "context")
		bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
		defer cancel()
		require.NoError(t, l.Close(bounded), "a Close after the panicking one still releases and returns")
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		require.False(t, row.Live, "the lease was released")
		require.Error(t, lease.Err())
	})

	// Guarantee: Close releases every lease, stops the heartbeat, and may be
	// called again.
	t.Run("ReleasesEveryLeaseAndIsIdempotent", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
			pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond)))
		var leases []*pglease.Lease
		for i := range 3 {
			lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		cancelled, cancel := context.WithCancel(ctx)
		cancel()
		require.NoError(t, l.Close(cancelled), "Close releases even with a cancelled context")
		for _, lease := range leases {
			pgtest.WaitDone(t, lease, time.Second)
			require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
			row, _ := pgtest.ReadRow(t, pool, table, lease.Key())
			assert.False(t, row.Live, "%s released", lease.Key())
			require.NoError(t, lease.Unlock(ctx), "Unlock after Close is a no-op")
		}
		require.NoError(t, l.Close(ctx), "idempotent")
		_, err := l.Claim(ctx, "k0")
		require.ErrorIs(t, err, pglease.ErrClosed)
		// goleak in TestMain proves the heartbeat goroutine is gone.
	})

	// Guarantee: when Close returns, nothing of the Locker runs: no
	// goroutine of its claims, its heartbeat or its driver's statements, and
	// no statement of its claims on the server; on pgx's pool and on
	// database/sql with pgx's stdlib and with lib/pq. Through a link with
	// 200 ms of latency each way, a claim waits on a row lock another
	// transaction holds; Close ends it 100 ms in, as its statement travels
	// (for lib/pq, between its parse and its execute), with a Locker timeout
	// shorter than the server takes to answer the cancel. Every goroutine
	// that ran the Locker's calls, and every one they started, carries a
	// profiler label: none is left once Close has returned.
	for _, driver := range []string{"pgxpool", "pgx", "pq"} {
		t.Run("NothingOfTheLockerRunsAfterItReturns/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			freeRow(ctx, t, pool, table, "job")
			p := pgtest.Proxy(t, "")
			app := pgtest.AppName("closeall")
			db := driverDB(t, pgtest.AppPool(t, "", p, app), driver)
			end := pgtest.LockRow(t, pool, table, "job")
			t.Cleanup(func() { end(false) })

			id := pgtest.Name("close")
			var claimErr, closeErr error
			claimed := make(chan struct{})
			pprof.Do(ctx, pprof.Labels("pglease_test", id), func(ctx context.Context) {
				l := pglease.NewLocker(db, pglease.WithTable(table), pglease.WithHolder("claimer"),
					pglease.WithLogger(pgtest.Quiet), pglease.WithTimeout(300*time.Millisecond))
				warm, err := l.Claim(ctx, "warm") // the heartbeat runs; a connection is open and idle
				require.NoError(t, err)
				require.NoError(t, warm.Unlock(ctx))
				p.SetLatency(200*time.Millisecond, 0, 1)
				go func() {
					defer close(claimed)
					_, claimErr = l.Claim(ctx, "job")
				}()
				time.Sleep(100 * time.Millisecond) // the moment Close comes, not a wait for a condition
				cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
				defer cancel()
				closeErr = l.Close(cctx)
			})
			running := claimsRunning(ctx, t, pool, app)
			n, stacks := labelled(id)
			for wait := time.Now(); n > 0 && time.Since(wait) < 100*time.Millisecond; n, stacks = labelled(id) {
				time.Sleep(time.Millisecond) // the claim's goroutine, past its last statement, returning
			}
			end(true)
			require.NoError(t, closeErr)
			assert.Zero(t, running, "claim statements still running on the server when Close returned")
			assert.Zero(t, n, "goroutines of the Locker still running after Close returned:\n%s", stacks)
			if t.Failed() {
				return
			}
			<-claimed
			require.ErrorIs(t, claimErr, pglease.ErrClosed)
			p.SetLatency(0, 0, 1)
			requireNoLiveRowOf(t, pool, table, "claimer", 0, "job")
		})
	}

	// Guarantee: as NothingOfTheLockerRunsAfterItReturns, for claims in
	// flight together: a burst whose first key's row another transaction
	// has locked, and claims of free keys and of the locked row made at
	// once, through a link with 200 ms of latency each way. When Close has
	// returned nil, no goroutine and no statement of the Locker runs.
	for _, driver := range []string{"pgx", "pq"} {
		t.Run("NothingOfTheLockerRunsAfterItReturnsWithBurstsInFlight/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			freeRow(ctx, t, pool, table, "job")
			p := pgtest.Proxy(t, "")
			app := pgtest.AppName("closeburst")
			db := driverDB(t, pgtest.AppPool(t, "", p, app), driver)
			end := pgtest.LockRow(t, pool, table, "job")
			t.Cleanup(func() { end(false) })

			id := pgtest.Name("closeburst")
			var closeErr error
			var wg sync.WaitGroup
			got := make(chan string, 16)
			pprof.Do(ctx, pprof.Labels("pglease_test", id), func(ctx context.Context) {
				l := pglease.NewLocker(db, pglease.WithTable(table), pglease.WithHolder("claimer"),
					pglease.WithLogger(pgtest.Quiet), pglease.WithTimeout(300*time.Millisecond))
				warm, err := l.Claim(ctx, "warm")
				require.NoError(t, err)
				require.NoError(t, warm.Unlock(ctx))
				p.SetLatency(200*time.Millisecond, 0, 1)
				wg.Add(1)
				go func() {
					defer wg.Done()
					leases, errs := pglease.ClaimBurst(ctx, l, []string{"job", "b1", "b2"})
					for i, lease := range leases {
						got <- fmt.Sprintf("burst %d: lease %v, err %v", i, lease != nil, errs[i])
					}
				}()
				for _, key := range []string{"job", "f1", "f2", "f3", "f4"} {
					wg.Add(1)
					go func() {
						defer wg.Done()
						lease, err := l.Claim(ctx, key)
						got <- fmt.Sprintf("claim %s: lease %v, err %v", key, lease != nil, err)
					}()
				}
				time.Sleep(150 * time.Millisecond)
				cctx, cancel := context.WithTimeout(ctx, 20*time.Second)
				defer cancel()
				closeErr = l.Close(cctx)
			})
			running := claimsRunning(ctx, t, pool, app)
			n, stacks := labelled(id)
			for wait := time.Now(); n > 0 && time.Since(wait) < 100*time.Millisecond; n, stacks = labelled(id) {
				time.Sleep(time.Millisecond)
			}
			end(true)
			wg.Wait()
			require.NoError(t, closeErr)
			assert.Zero(t, running, "claim statements still running on the server when Close returned")
			assert.Zero(t, n, "goroutines of the Locker still running after Close returned:\n%s", stacks)
			p.SetLatency(0, 0, 1)
			close(got)
			var outcomes []string
			for o := range got {
				outcomes = append(outcomes, o)
			}
			var live []string
			for _, key := range []string{"job", "b1", "b2", "f1", "f2", "f3", "f4"} {
				if row, ok := pgtest.ReadRow(t, pool, table, key); ok && row.Live {
					live = append(live, key)
				}
			}
			assert.Empty(t, live, "rows live after Close returned nil (the claims: %v)", outcomes)
		})
	}

	// Guarantee: a Close whose context ends while a claim it cancelled still
	// runs says so, naming the claim's key, and that claim then ends by
	// itself within the bound Close's doc gives (2s plus the Locker's
	// timeout), and every goroutine of the Locker with it, but for pgx's
	// clean-up of the claim's connection, which pgx bounds by its own 15 s.
	// The link to the server stalls while the claim waits on a row lock, so
	// that its cancel request is never answered. Once only that clean-up
	// is left, the link heals, and it ends too, as its own cancel request
	// is answered, rather than wait out pgx's 15 s.
	t.Run("ClaimStillRunningIsNamedAndEndsByItself", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		freeRow(ctx, t, pool, table, "job")
		p := pgtest.Proxy(t, "")
		app := pgtest.AppName("closestall")
		db := pgtest.AppPool(t, "", p, app)
		end := pgtest.LockRow(t, pool, table, "job")
		t.Cleanup(func() { end(false); p.SetMode(faultproxy.Forward) })

		const timeout = 300 * time.Millisecond
		id := pgtest.Name("closestall")
		var closeErr error
		var took time.Duration
		claimed := make(chan error, 1)
		pprof.Do(ctx, pprof.Labels("pglease_test", id), func(ctx context.Context) {
			l := pglease.NewLocker(db, pglease.WithTable(table), pglease.WithHolder("claimer"),
				pglease.WithLogger(pgtest.Quiet), pglease.WithTimeout(timeout))
			go func() {
				_, err := l.Claim(ctx, "job")
				claimed <- err
			}()
			pgtest.LockWaiter(t, pool, app, "pglease.synchronous_commit", 5*time.Second)
			p.SetMode(faultproxy.Stall)
			cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
			defer cancel()
			start := time.Now()
			closeErr = l.Close(cctx)
			select {
			case err := <-claimed:
				took = time.Since(start)
				require.ErrorIs(t, err, pglease.ErrClosed)
			case <-time.After(2*answerGrace + timeout + 5*time.Second):
				t.Fatal("the claim Close cancelled had not ended 5s past its bound")
			}
		})
		require.Error(t, closeErr)
		require.Contains(t, closeErr.Error(), `claims still in flight: "job"`)
		require.ErrorIs(t, closeErr, context.DeadlineExceeded)
		assert.Less(t, took, 2*answerGrace+timeout+answerGrace/2, "the claim's end after Close began")
		n, stacks := labelled(id)
		for wait := time.Now(); !onlyCleanup(stacks) && time.Since(wait) < 5*time.Second; n, stacks = labelled(id) {
			time.Sleep(10 * time.Millisecond)
		}
		require.True(t, onlyCleanup(stacks), "goroutines of the Locker, besides pgx's clean-up of the claim's connection, still run 5s after its claim ended:\n%s", stacks)
		p.SetMode(faultproxy.Forward)
		for wait := time.Now(); n > 0 && time.Since(wait) < 5*time.Second; n, stacks = labelled(id) {
			time.Sleep(10 * time.Millisecond)
		}
		require.Zero(t, n, "goroutines of the Locker still run 5s after the link healed:\n%s", stacks)
	})

	// Guarantee: Close ends or waits for every claim in flight, and holds
	// nothing when it returns: a claim whose statement has committed but whose
	// reply is still on its way when Close runs must not outlive Close, or its
	// release would run on a pool the caller has closed by then, and the row
	// would stay live a whole TTL with nobody holding it.
	t.Run("WaitsForTheClaimInFlight", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))
		pglease.SetCoalescing(l, false)

		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		claimed := make(chan error, 1)
		go func() {
			_, err := l.Claim(ctx, "job")
			claimed <- err
		}()
		<-claim.Hit
		<-claim.Ran // committed; the reply is held

		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		select {
		case err := <-closed:
			// The claim has returned (its goroutine reports it just after);
			// its reply is still held, so it can only have returned because
			// Close ended it.
			select {
			case claimErr := <-claimed:
				t.Logf("Close: %v; the claim in flight: %v", err, claimErr)
			case <-time.After(5 * time.Second):
				t.Fatal("Close returned while a claim was in flight")
			}
		case <-time.After(10 * time.Second):
			t.Fatal("Close did not return within 10s")
		}
		claim.Deliver()
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		require.False(t, row.Live, "Close returned and left a live row nobody holds: %+v", row)
	})
}

// releaseHold is a pgx tracer that holds the release statement of one
// fence before it is sent, until released: a slow link under that one
// release, the others going through.
type releaseHold struct {
	fence   atomic.Int64 // 0: none held
	entered chan struct{}
	open    chan struct{}
	once    sync.Once
}

// hold makes the next release of fence wait; release lets it go.
func (h *releaseHold) hold(fence int64) (release func()) {
	h.fence.Store(fence)
	var once sync.Once
	return func() { once.Do(func() { close(h.open) }) }
}

func (h *releaseHold) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	fence := h.fence.Load()
	if fence == 0 || pgtest.StatementKind(data.SQL) != "release" {
		return ctx
	}
	for _, arg := range data.Args { // one lease's fence, or a burst's
		switch a := arg.(type) {
		case int64:
			if a != fence {
				continue
			}
		case []int64:
			if !slices.Contains(a, fence) {
				continue
			}
		default:
			continue
		}
		h.once.Do(func() { close(h.entered) })
		select {
		case <-h.open:
		case <-ctx.Done():
		}
		break
	}
	return ctx
}

func (h *releaseHold) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Close releases every lease in one statement, then the rows it found
// locked again and again until each is settled: pending shrinks to the
// locked each round, and each round's outcome must be read in that round's
// leases. Rows locked by transactions that end differently (revoked and
// committed, left as they were, force-expired and taken) settle in later
// rounds, among rows released in the first.
func testCloseSettlesLockedRowsByTheirOwnOutcomes(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	for round := range 3 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			ev := pgtest.NewEvents(t)
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("c%d", round), pglease.WithTTL(30*time.Second),
				pglease.WithHeartbeatInterval(10*time.Second), pglease.WithHook(ev.Hook))
			const n = 10
			leases := make([]*pglease.Lease, n)
			for i := range leases {
				var err error
				leases[i], err = l.Claim(ctx, fmt.Sprintf("c%d-%d", round, i))
				require.NoError(t, err)
			}
			// Three locked rows, at random places, each ending another way
			// and at another time.
			perm := rand.Perm(n)
			revIdx, plainIdx, takenIdx := perm[0], perm[1], perm[2]
			lockTx := func(key string) pgx.Tx {
				tx, err := pool.Begin(ctx)
				require.NoError(t, err)
				t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
				_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = $1 FOR UPDATE`, pgx.Identifier{table}.Sanitize()), key)
				require.NoError(t, err)
				return tx
			}
			txRev, txPlain, txTaken := lockTx(leases[revIdx].Key()), lockTx(leases[plainIdx].Key()), lockTx(leases[takenIdx].Key())
			delays := rand.Perm(3)
			var wg sync.WaitGroup
			q := pgx.Identifier{table}.Sanitize()
			wg.Go(func() {
				time.Sleep(time.Duration(100+150*delays[0]) * time.Millisecond)
				_, err := txRev.Exec(context.Background(), `UPDATE `+q+` SET holder = $2 WHERE key = $1`, leases[revIdx].Key(), sqlstmt.RevokedHolder)
				if err == nil {
					err = txRev.Commit(context.Background())
				}
				if err != nil {
					t.Errorf("rev: %v", err)
				}
			})
			wg.Go(func() {
				time.Sleep(time.Duration(100+150*delays[1]) * time.Millisecond)
				if err := txPlain.Commit(context.Background()); err != nil {
					t.Errorf("plain: %v", err)
				}
			})
			wg.Go(func() {
				time.Sleep(time.Duration(100+150*delays[2]) * time.Millisecond)
				_, err := txTaken.Exec(context.Background(), `UPDATE `+q+` SET holder = 'someone-else', fence = nextval($2) WHERE key = $1`, leases[takenIdx].Key(), table+"_fence_seq")
				if err == nil {
					err = txTaken.Commit(context.Background())
				}
				if err != nil {
					t.Errorf("taken: %v", err)
				}
			})
			closeErr := l.Close(ctx)
			wg.Wait()
			require.NoError(t, closeErr, "losses are no error of Close's")
			for i, ls := range leases {
				err := ls.Unlock(ctx) // the outcome Close's release recorded
				switch i {
				case revIdx:
					require.ErrorIs(t, err, pglease.ErrRevoked, "lease %d (revoked while locked)", i)
					require.Contains(t, err.Error(), fmt.Sprintf("unlock %q fence %d", ls.Key(), ls.Fence()))
				case takenIdx:
					require.ErrorIs(t, err, pglease.ErrLost, "lease %d (taken while locked)", i)
					require.NotErrorIs(t, err, pglease.ErrRevoked, "lease %d", i)
					require.Contains(t, err.Error(), "holder someone-else", "lease %d", i)
				default:
					require.NoError(t, err, "lease %d (plain %v)", i, i == plainIdx)
					row, ok := pgtest.ReadRow(t, pool, table, ls.Key())
					require.True(t, ok)
					require.Equal(t, ls.Fence(), row.Fence)
					require.False(t, row.Live, "lease %d released", i)
				}
			}
			for i, ls := range leases {
				var kinds []string
				for _, x := range ev.All() {
					if x.Key == ls.Key() && (x.Kind == pglease.EventReleased || x.Kind == pglease.EventReleaseFailed) {
						kinds = append(kinds, x.Kind.String())
					}
				}
				want := "released"
				if i == revIdx || i == takenIdx {
					want = "release_failed"
				}
				require.Equal(t, want, strings.Join(kinds, ","), "lease %d", i)
			}
		})
	}
}

// burstInFlightAtClose sends a burst of claims of k1 and k2 on a Locker of
// holder "a" (TTL a minute) on a pool, whose reply it holds back for a
// second, and returns once the burst is in flight: out gets the claims'
// errors. The second is the time a test has to call Close while the claims
// are in flight; on a loaded machine 300 ms was not always enough. If
// heldBy is not empty, a Locker of that holder holds both keys first, and
// the reply is held back only until the first cancel request was sent:
// the claims are answered after their context ended.
func burstInFlightAtClose(t *testing.T, heldBy string) (context.Context, *pgxpool.Pool, string, *pglease.Locker, <-chan []error) {
	t.Helper()
	ctx, pool, table := pgtest.Setup(t)
	if heldBy != "" {
		other := pgtest.Locker(t, pool, table, heldBy, pglease.WithTTL(time.Minute))
		for _, key := range []string{"k1", "k2"} {
			_, err := other.Claim(ctx, key)
			require.NoError(t, err)
		}
	}
	late := pgtest.NewLateCancel(t, 0)
	// Each statement in one round trip, and every connection dialled
	// first: the read held back is the burst's reply (its claims
	// committed), not a prepare's nor a connection's start.
	dsn := pool.Config().ConnString() + " default_query_exec_mode=exec"
	if u, err := url.Parse(pool.Config().ConnString()); err == nil && strings.HasPrefix(u.Scheme, "postgres") {
		q := u.Query()
		q.Set("default_query_exec_mode", "exec")
		u.RawQuery = q.Encode()
		dsn = u.String()
	}
	lpool, _ := late.Pool(t, dsn, 4)
	var dialled []*pgxpool.Conn
	for range 4 {
		c, err := lpool.Acquire(ctx)
		require.NoError(t, err)
		dialled = append(dialled, c)
	}
	for _, c := range dialled {
		c.Release()
	}
	l := pgtest.Locker(t, lpool, table, "a", pglease.WithTTL(time.Minute))
	send := pglease.PrepareClaimBurst([]context.Context{ctx, ctx}, l, []string{"k1", "k2"})
	// Long enough for the test's steps before its Close on a loaded
	// machine (Close waits for the reply however late it comes): with 1 s,
	// the reply came before Close there, and the claims returned leases.
	late.DelayNextReply(3 * time.Second)
	if heldBy != "" {
		late.DelayNextReplyTillCancel(3 * time.Second)
	}
	out := make(chan []error, 1)
	go func() {
		_, errs := send()
		out <- errs
	}()
	<-late.ReplyHeld() // the burst is in flight, its reply held back
	return ctx, pool, table, l, out
}

// requireEndedByClose requires that each claim Close ended says so.
func requireEndedByClose(t *testing.T, errs []error) {
	t.Helper()
	for i, err := range errs {
		require.ErrorIs(t, err, pglease.ErrClosed, "claim %d", i)
	}
}
