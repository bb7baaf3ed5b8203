package faults_test

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
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// Fault injection with real parts: a TCP proxy between a Locker's pool and
// PostgreSQL (internal/faultproxy), backends terminated server-side, row
// locks held by other transactions, and server restarts. Each test logs its
// measured figures on lines starting with "figures:".

// backendWaiting reports whether backend pid is still waiting on a lock.
func backendWaiting(t *testing.T, db pglease.DB, pid int32) bool {
	t.Helper()
	var waiting bool
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1 AND wait_event_type = 'Lock')`, pid).Scan(&waiting))
	return waiting
}

// backendGone waits until backend pid has exited: a statement it was
// running has then either taken effect or not, for good.
func backendGone(t *testing.T, db pglease.DB, pid int32) {
	t.Helper()
	require.Eventually(t, func() bool {
		var alive bool
		return db.QueryRow(context.Background(), `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE pid = $1)`, pid).Scan(&alive) == nil && !alive
	}, 20*time.Second, 5*time.Millisecond, "backend %d exits", pid)
}

// serverPassed waits until the database clock is past at.
func serverPassed(t *testing.T, db pglease.DB, at time.Time) {
	t.Helper()
	require.Eventually(t, func() bool {
		var past bool
		return db.QueryRow(context.Background(), `SELECT clock_timestamp() > $1`, at).Scan(&past) == nil && past
	}, 10*time.Second, 5*time.Millisecond)
}

// lastTrusted asks lease.Err as often as it can until the lease is declared
// lost, and returns the last instant Err was still nil and the first one it
// was not.
func lastTrusted(t *testing.T, lease *pglease.Lease, limit time.Duration) (trusted, lost time.Time) {
	t.Helper()
	give := time.Now().Add(limit)
	for {
		asked := time.Now()
		if lease.Err() != nil {
			return trusted, asked
		}
		trusted = asked
		if asked.After(give) {
			t.Fatalf("lease %q still trusted after %v", lease.Key(), limit)
		}
	}
}

// cutSetup gives a mid-statement cut test its context, a direct pool, a
// table, a fault proxy and the application name its Locker's pool uses.
func cutSetup(t *testing.T, name string) (context.Context, *pgxpool.Pool, string, *faultproxy.Proxy, string) {
	t.Helper()
	direct := pgtest.Pool(t, nil)
	return pgtest.Ctx(t), direct, pgtest.Table(t, direct), pgtest.Proxy(t, ""), pgtest.AppName(name)
}

// TestFault injects faults between a Locker and its server (latency,
// blackholes, connection resets, restarts, table locks, a paused holder)
// and checks that no loss is false, no fence goes back and nothing late
// touches a later mandate.
func TestFault(t *testing.T) {
	t.Parallel()
	t.Run("JitterCausesNoFalseLoss", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		proxy := pgtest.Proxy(t, "")
		// 25-100 ms each way: every statement takes 50-200 ms.
		proxy.SetLatency(62*time.Millisecond, 38*time.Millisecond, 1)
		const ttl, interval = 2 * time.Second, 300 * time.Millisecond
		events := pgtest.NewEvents(t)
		a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, pgtest.AppName("latency")), table, "slow-replica",
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook))
		b := pgtest.Locker(t, direct, table, "fast-replica", pglease.WithTTL(ttl))

		var leases []*pglease.Lease
		for i := range 10 {
			lease, err := a.Claim(ctx, fmt.Sprintf("k%d", i))
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		for ev := events.WaitFor(t, pglease.EventExtended, ttl); ev.Leases < len(leases); {
			ev = events.WaitFor(t, pglease.EventExtended, ttl) // rounds that ran while claiming
		}
		start := time.Now()
		var worst time.Duration
		rounds := 0
		for time.Since(start) < 2*ttl { // across two TTLs of heartbeats
			ev := events.WaitFor(t, pglease.EventExtended, ttl)
			require.Equal(t, len(leases), ev.Leases, "every lease extended in each round")
			worst = max(worst, ev.Took)
			rounds++
			_, err := b.Claim(ctx, "k0")
			require.ErrorIs(t, err, pglease.ErrHeld)
		}
		assert.Zero(t, events.Count(pglease.EventLost))
		assert.Zero(t, events.Count(pglease.EventHeartbeatFailed))
		for _, lease := range leases {
			require.NoError(t, lease.Err())
			row, _ := pgtest.ReadRow(t, direct, table, lease.Key())
			require.Equal(t, lease.Fence(), row.Fence)
			require.True(t, row.Live)
		}
		for _, lease := range leases {
			require.NoError(t, lease.Unlock(ctx))
		}
		assert.Less(t, worst, ttl/2, "the injected latency stays well inside the trust margin")
		t.Logf("figures: latency 50-200ms per statement, %d heartbeat rounds over %v, slowest round %v, TTL %v, losses 0",
			rounds, time.Since(start).Round(time.Millisecond), worst.Round(time.Millisecond), ttl)
	})

	t.Run("BlackholeLosesTheLeaseFirst", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		proxy := pgtest.Proxy(t, "")
		const ttl, interval = time.Second, 200 * time.Millisecond
		events := pgtest.NewEvents(t)
		a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, pgtest.AppName("blackhole")), table, "partitioned",
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook), pglease.WithTimeout(time.Second))
		// b's own heartbeat is far away, so its row only changes if someone else
		// changes it.
		b := pgtest.Locker(t, direct, table, "survivor", pglease.WithTTL(30*time.Second))

		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		events.WaitFor(t, pglease.EventExtended, 2*time.Second)

		proxy.SetMode(faultproxy.Blackhole)
		trusted, lost := lastTrusted(t, lease, 3*ttl)
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		row, _ := pgtest.ReadRow(t, direct, table, "k")
		require.Equal(t, lease.Fence(), row.Fence)
		require.True(t, trusted.Before(row.ExpiresAt),
			"trusted locally until %v, after the server expiry %v", trusted, row.ExpiresAt)

		// Another replica takes over once the server lets it, not before.
		next := pgtest.TakeOver(ctx, t, b, "k", lease, 3*ttl)
		require.False(t, next.AcquiredAt().Before(row.ExpiresAt), "claimed at %v, old lease expired at %v", next.AcquiredAt(), row.ExpiresAt)
		taken, _ := pgtest.ReadRow(t, direct, table, "k")

		// The network heals: the old holder's heartbeat and Unlock touch nothing.
		proxy.SetMode(faultproxy.Forward)
		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
		_, err = a.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld, "the partitioned replica is back and sees the new mandate")
		extended := events.Count(pglease.EventExtended)
		_, err = a.Claim(ctx, "other") // gives a's heartbeat something to do again
		require.NoError(t, err)
		require.Eventually(t, func() bool { return events.Count(pglease.EventExtended) > extended }, 5*time.Second, 10*time.Millisecond)
		after, _ := pgtest.ReadRow(t, direct, table, "k")
		got := pgtest.Row{Holder: after.Holder, Fence: after.Fence, AcquiredAt: after.AcquiredAt, ExpiresAt: after.ExpiresAt, Live: taken.Live}
		require.Equal(t, taken, got)
		require.NoError(t, next.Err())
		t.Logf("figures: blackhole > TTL %v: Err() last nil %v before the server expiry (next poll %v later), takeover %v after that expiry, fence %d -> %d, dropped %d bytes",
			ttl, row.ExpiresAt.Sub(trusted), lost.Sub(trusted), next.AcquiredAt().Sub(row.ExpiresAt), lease.Fence(), next.Fence(), proxy.Stats().DroppedBytes)
	})

	t.Run("ConnectionResetsAreReportedHonestly", func(t *testing.T) {
		t.Parallel()
		for _, how := range []string{"pg_terminate_backend", "proxy reset"} {
			t.Run(how, func(t *testing.T) {
				t.Parallel()
				cut := func(t *testing.T, direct *pgxpool.Pool, proxy *faultproxy.Proxy, pid int32) {
					t.Helper()
					if how == "proxy reset" {
						require.Positive(t, proxy.ResetAll())
						return
					}
					var ok bool
					require.NoError(t, direct.QueryRow(context.Background(), `SELECT pg_terminate_backend($1)`, pid).Scan(&ok))
					require.True(t, ok)
				}
				t.Run("claim", func(t *testing.T) {
					t.Parallel()
					ctx, direct, table, proxy, app := cutSetup(t, "midclaim")
					a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, app), table, "a", pglease.WithTTL(2*time.Second))
					seed, err := a.Claim(ctx, "k")
					require.NoError(t, err)
					require.NoError(t, seed.Unlock(ctx))

					end := pgtest.LockRow(t, direct, table, "k")
					got := pgtest.ClaimInBackground(ctx, a, "k")
					pid := pgtest.LockWaiter(t, direct, app, "INSERT INTO", 10*time.Second)
					cut(t, direct, proxy, pid)
					r := <-got
					require.Error(t, r.Err)
					require.NotErrorIs(t, r.Err, pglease.ErrHeld, "a cut connection is a failure, not contention")
					require.Nil(t, r.Lease)
					_, held := a.Held("k")
					require.False(t, held)
					end(true)
					// A proxy reset leaves the statement queued on the server
					// until pgx's cancel request reaches it; if the row lock is
					// freed first, the claim commits for a client that is gone,
					// and the row carries a's holder until its expiry.
					backendGone(t, direct, pid)
					row, _ := pgtest.ReadRow(t, direct, table, "k")
					orphan := row.Fence != seed.Fence()
					next, err := a.Claim(ctx, "k")
					require.NoError(t, err, "the next claim works")
					require.Greater(t, next.Fence(), max(seed.Fence(), row.Fence))
					t.Logf("figures: %s mid-claim: claim error %q; orphan statement ran after the client left: %v (row fence %d, seed %d)",
						how, r.Err, orphan, row.Fence, seed.Fence())
				})
				t.Run("heartbeat", func(t *testing.T) {
					t.Parallel()
					ctx, direct, table, proxy, app := cutSetup(t, "midheartbeat")
					events := pgtest.NewEvents(t)
					a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, app), table, "a", pglease.WithTTL(3*time.Second),
						pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook))
					lease, err := a.Claim(ctx, "k")
					require.NoError(t, err)
					_, end := pgtest.LockTable(t, direct, table)
					pid := pgtest.LockWaiter(t, direct, app, "unnest(", 10*time.Second)
					cut(t, direct, proxy, pid)
					events.WaitFor(t, pglease.EventHeartbeatFailed, 2*time.Second)
					end(false)
					before := events.Count(pglease.EventExtended)
					require.Eventually(t, func() bool { return events.Count(pglease.EventExtended) > before }, 3*time.Second, 5*time.Millisecond)
					require.NoError(t, lease.Err(), "a cut shorter than the trust window loses nothing")
					row, _ := pgtest.ReadRow(t, direct, table, "k")
					require.Equal(t, lease.Fence(), row.Fence)
					require.NoError(t, lease.Unlock(ctx))
				})
				t.Run("release", func(t *testing.T) {
					t.Parallel()
					ctx, direct, table, proxy, app := cutSetup(t, "midrelease")
					const ttl = 2 * time.Second
					a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, app), table, "a", pglease.WithTTL(ttl))
					b := pgtest.Locker(t, direct, table, "b", pglease.WithTTL(ttl))
					lease, err := a.Claim(ctx, "k")
					require.NoError(t, err)
					// A table lock: a release skips a locked row, but waits
					// behind a lock on the whole table.
					_, end := pgtest.LockTable(t, direct, table)
					unlocked := make(chan error, 1)
					go func() { unlocked <- lease.Unlock(ctx) }()
					pid := pgtest.LockWaiter(t, direct, app, "GREATEST(", 10*time.Second)
					cut(t, direct, proxy, pid)
					uerr := <-unlocked
					require.Error(t, uerr, "a release whose outcome is unknown is never reported as done")
					require.Error(t, lease.Err(), "the lease is over either way")
					end(false)
					backendGone(t, direct, pid)
					row, _ := pgtest.ReadRow(t, direct, table, "k")
					require.Equal(t, lease.Fence(), row.Fence)
					orphan := !row.Live
					// Whatever happened to the release, the key is free again by
					// the old lease's expiry at the latest.
					pgtest.TakeOver(ctx, t, b, "k", lease, 3*ttl)
					t.Logf("figures: %s mid-release: Unlock error %q; release applied anyway (orphan): %v, row live after: %v",
						how, uerr, orphan, row.Live)
				})
			})
		}
	})

	t.Run("ServerRestartNeverLowersTheFence", func(t *testing.T) {
		t.Parallel()
		ctx, srv, pool, table := pgtest.PrivateSetup(t)
		const ttl, interval = 3 * time.Second, 300 * time.Millisecond
		events := pgtest.NewEvents(t)
		var lockers []*pglease.Locker
		for i := range 3 {
			lockers = append(lockers, pgtest.Locker(t, pool, table, fmt.Sprintf("r%d", i),
				pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook), pglease.WithTimeout(2*time.Second)))
		}
		var (
			highest        int64 // the greatest fence issued so far
			held           []*pglease.Lease
			survived, lost int
		)
		claimAll := func(round int) {
			held = held[:0]
			for i, l := range lockers {
				for k := range 3 {
					key := fmt.Sprintf("r%d-k%d", i, k)
					var lease *pglease.Lease
					require.Eventually(t, func() bool {
						var err error
						lease, err = l.Claim(ctx, key)
						return err == nil
					}, 10*time.Second, 50*time.Millisecond, "round %d: claims work again", round)
					require.Greater(t, lease.Fence(), highest, "round %d: a fence is above every fence issued before it", round)
					highest = lease.Fence()
					held = append(held, lease)
				}
			}
		}
		// Every lease held before the restart is either still held, with its
		// row intact and live, or lost; none is believed without its row.
		check := func(mode pgserver.Mode) {
			for _, lease := range held {
				row, _ := pgtest.ReadRow(t, pool, table, lease.Key())
				if err := lease.Err(); err != nil {
					require.ErrorIs(t, err, pglease.ErrLost, "after a %s restart", mode)
					lost++
					continue
				}
				require.Equal(t, lease.Fence(), row.Fence, "after a %s restart", mode)
				require.True(t, row.Live, "a lease still believed has a live row after a %s restart", mode)
				survived++
			}
		}

		claimAll(0)
		for round, mode := range []pgserver.Mode{pgserver.Fast, pgserver.Immediate, pgserver.Immediate} {
			before := events.Count(pglease.EventExtended)
			require.NoError(t, srv.Restart(ctx, mode))
			// Heartbeats resume, or, where the restart outlasted the trust
			// window (a loaded machine's recovery can), every lease held
			// before it is reported lost: nothing is believed in between.
			require.Eventually(t, func() bool {
				if events.Count(pglease.EventExtended) >= before+2*len(lockers) {
					return true
				}
				for _, lease := range held {
					if lease.Err() == nil {
						return false
					}
				}
				return true
			}, 2*ttl, 10*time.Millisecond, "heartbeats resume, or every lease is reported lost, after a %s restart", mode)
			check(mode)
			claimAll(round + 1) // re-entrant claims: each replaces the lease it held
		}

		// A server down longer than the TTL: every lease is lost, and the fences
		// after it still grow.
		require.NoError(t, srv.Stop(pgserver.Immediate))
		for _, lease := range held {
			pgtest.WaitDone(t, lease, 2*ttl)
			require.ErrorIs(t, lease.Err(), pglease.ErrLost)
			lost++
		}
		require.NoError(t, srv.Start(ctx))
		claimAll(9)
		t.Logf("figures: 3 restarts (fast, immediate x2) + 1 outage > TTL: %d leases survived, %d declared lost, 0 fences issued twice or lower (highest %d)",
			survived, lost, highest)
	})

	t.Run("BlockedHeartbeatCannotReArmALaterRow", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		app := pgtest.AppName("rowlock")
		proxy := pgtest.Proxy(t, "")
		const ttl = time.Second
		a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, app), table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond),
			pglease.WithTimeout(time.Second))
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)

		tx, commit := pgtest.LockTable(t, direct, table)
		tbl := pgx.Identifier{table}.Sanitize()
		pid := pgtest.LockWaiter(t, direct, app, "unnest(", 10*time.Second)
		// At the trust deadline pgx gives up on the statement and sends a
		// cancel request on a new connection. Drop it, as a partition would:
		// the heartbeat then stays queued on the server, the worst case.
		proxy.SetMode(faultproxy.Blackhole)

		trusted, _ := lastTrusted(t, lease, 3*ttl)
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		row, _ := pgtest.ReadRow(t, direct, table, "k")
		require.True(t, trusted.Before(row.ExpiresAt), "trusted until %v, server expiry %v", trusted, row.ExpiresAt)
		// A backend waiting on a lock does not notice that its client left.
		require.True(t, backendWaiting(t, direct, pid), "the abandoned heartbeat is still queued on the server")
		serverPassed(t, direct, row.ExpiresAt)

		// While the heartbeat waits, the next mandate takes the expired row and
		// releases it with a 30 s min hold, as claimSQL and releaseSQL do: the
		// released row stays live, which is what a heartbeat guarded by holder
		// and expiry alone would re-arm for a full TTL.
		tag, err := tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = 'next', fence = nextval(%s), acquired_at = clock_timestamp(),
		expires_at = clock_timestamp() + interval '60 seconds' WHERE key = 'k' AND expires_at <= clock_timestamp()`,
			tbl, "'"+pgx.Identifier{table + "_fence_seq"}.Sanitize()+"'"))
		require.NoError(t, err)
		require.EqualValues(t, 1, tag.RowsAffected())
		_, err = tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = GREATEST(clock_timestamp(), acquired_at + interval '30 seconds') WHERE key = 'k'`, tbl))
		require.NoError(t, err)
		var next pgtest.Row
		require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf(`SELECT holder, fence, acquired_at, expires_at FROM %s WHERE key = 'k'`, tbl)).
			Scan(&next.Holder, &next.Fence, &next.AcquiredAt, &next.ExpiresAt))
		commit(true)
		// The network heals (pgx's cancel request was lost with it), and the
		// queued heartbeat runs once the lock is free.
		proxy.SetMode(faultproxy.Forward)
		backendGone(t, direct, pid)

		after, _ := pgtest.ReadRow(t, direct, table, "k")
		require.True(t, after.Live)
		after.Live = false
		require.Equal(t, next, after, "the late heartbeat left the next mandate's released row untouched")
		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
		_, err = a.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld)
		final, _ := pgtest.ReadRow(t, direct, table, "k")
		final.Live = false
		require.Equal(t, next, final)
		t.Logf("figures: heartbeat blocked by a table lock past the TTL: trusted until %v before the server expiry; the abandoned heartbeat ran after the next mandate's release and left it untouched",
			row.ExpiresAt.Sub(trusted))
	})

	t.Run("PausedHolderTouchesNothingLater", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		proxy := pgtest.Proxy(t, "")
		app := pgtest.AppName("paused")
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		a := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, app), table, "paused", pglease.WithTTL(ttl),
			pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook), pglease.WithTimeout(time.Second))
		b := pgtest.Locker(t, direct, table, "next", pglease.WithTTL(30*time.Second))
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		events.WaitFor(t, pglease.EventExtended, 2*time.Second)

		// Everything the holder sends from now on is held, as if its process
		// were stopped after writing to its sockets, or its link congested.
		proxy.SetMode(faultproxy.Stall)
		pgtest.WaitDone(t, lease, 3*ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		next := pgtest.TakeOver(ctx, t, b, "k", lease, 3*ttl)
		taken, _ := pgtest.ReadRow(t, direct, table, "k")

		// Resume: the held heartbeat reaches the server after the takeover.
		proxy.SetMode(faultproxy.Forward)
		require.Eventually(t, func() bool { return proxy.Stats().LateBytes > 0 }, 5*time.Second, 5*time.Millisecond)
		require.Eventually(t, func() bool {
			var busy int
			return direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE application_name = $1 AND state = 'active'`, app).Scan(&busy) == nil && busy == 0
		}, 5*time.Second, 5*time.Millisecond, "the late statements have run")
		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
		after, _ := pgtest.ReadRow(t, direct, table, "k")
		require.Equal(t, taken, after, "the next mandate is untouched")
		require.NoError(t, next.Err())
		t.Logf("figures: paused holder: %d bytes delivered late after the takeover, next mandate fence %d untouched", proxy.Stats().LateBytes, next.Fence())
	})

	t.Run("ContextEndsDespiteAHungRelease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		const ttl, timeout = time.Second, 4 * time.Second
		a := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithTimeout(timeout))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(30*time.Second))
		working, err := a.Claim(ctx, "working")
		require.NoError(t, err)
		finished, err := a.Claim(ctx, "finished")
		require.NoError(t, err)
		jobCtx, cancel := working.Context(ctx)
		defer cancel()

		// The network to the database goes bad: heartbeats fail, and the
		// release of the job that just finished hangs until its timeout.
		db.SetFail("heartbeat", errors.New("network unreachable"))
		open := db.Hold("release")
		defer open()
		go func() { _ = finished.Unlock(ctx) }()
		require.Equal(t, "release", <-db.Entered)

		// Another replica takes the working job's key once the server lets it.
		next := pgtest.TakeOver(ctx, t, b, "working", working, 3*ttl)
		takenAt := time.Now()
		// Done and the job's context, not Err (which checks the deadline when
		// called), are what a job running under the lease watches.
		select {
		case <-jobCtx.Done():
		default:
			<-jobCtx.Done()
			t.Fatalf("the job's context was still live when another replica took its key, and ended %v later: "+
				"the heartbeat goroutine, which declares leases lost, waited for the hanging release", time.Since(takenAt))
		}
		require.ErrorIs(t, working.Err(), pglease.ErrLost)
		require.Greater(t, next.Fence(), working.Fence())
	})
}
