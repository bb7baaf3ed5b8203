package pglease_test

import (
	"context"
	"errors"
	"slices"
	"strings"
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

// TestKeptConnection pins WithKeptConnection, the heartbeat's own
// connection, and what the heartbeat does without it on a pool shared with
// jobs.
func TestKeptConnection(t *testing.T) {
	t.Parallel()
	t.Run("JobsHoldingThePoolDoNotStarveIt", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		pool := sharedPool(t, pgtest.AppName("starve"))
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHook(events.Hook), pglease.WithKeptConnection())
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		size := int(pool.Stat().MaxConns())
		stop := hogPool(t, pool, size)
		require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == int32(size) }, 5*time.Second, 5*time.Millisecond,
			"the jobs hold every other connection")
		before := events.Count(pglease.EventExtended)

		select { // twice the trust window with every connection taken by jobs
		case <-lease.Done():
			t.Fatalf("lease lost while jobs held the pool: %v", lease.Err())
		case <-time.After(2 * ttl):
		}
		require.NoError(t, lease.Err())
		assert.Greater(t, events.Count(pglease.EventExtended), before+2, "heartbeat rounds ran")
		assert.Zero(t, events.Count(pglease.EventHeartbeatFailed))
		row, _ := pgtest.ReadRow(t, direct, table, "k")
		require.Equal(t, lease.Fence(), row.Fence)
		require.True(t, row.Live)

		stop()
		require.NoError(t, l.Close(ctx))
		// pgxpool may finish taking a connection back on a goroutine of its own.
		assert.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == 0 }, 2*time.Second, 5*time.Millisecond,
			"Close gives the kept connection back to the pool")
		t.Logf("figures: pool of %d shared with jobs holding all they could for %v; %d heartbeat rounds, no loss",
			size, 2*ttl, events.Count(pglease.EventExtended)-before)
	})

	// Guarantee: Unlocks never make the heartbeat wait for the pool. On a
	// pool whose every other connection is held by jobs, Unlocks made at once
	// (of rows free, or locked by another transaction) wait for the kept
	// connection or a pool connection without keeping the heartbeat's round
	// out meanwhile: the held lease is extended at every round, and each
	// Unlock releases its row once it can (a row locked past its expiry
	// lapses, reported as lost).
	t.Run("UnlocksOnAFullPoolDoNotHoldUpTheHeartbeat", func(t *testing.T) {
		t.Parallel()
		for _, locked := range []bool{false, true} {
			name := "free"
			if locked {
				name = "locked"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, direct, table := pgtest.Setup(t)
				pool := sharedPool(t, pgtest.AppName("unlocks"))
				const ttl = time.Second
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHook(events.Hook), pglease.WithKeptConnection())
				held, err := l.Claim(ctx, "held")
				require.NoError(t, err)
				var leases []*pglease.Lease
				for _, key := range []string{"u1", "u2", "u3", "u4"} {
					lease, err := l.Claim(ctx, key)
					require.NoError(t, err)
					leases = append(leases, lease)
				}
				var tx pgx.Tx
				if locked {
					tx = pgtest.LockRows(t, direct, table, `key LIKE 'u%'`)
				}
				size := int(pool.Stat().MaxConns())
				stop := hogPool(t, pool, size)
				require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == int32(size) }, 5*time.Second, 5*time.Millisecond,
					"the jobs hold every other connection")
				before := events.Count(pglease.EventExtended)

				unlocked := make(chan error, len(leases))
				for _, lease := range leases {
					go func() { unlocked <- lease.Unlock(ctx) }()
				}
				select { // twice the trust window, with the Unlocks under way
				case <-held.Done():
					t.Fatalf("lease lost behind Unlocks on a full pool: %v", held.Err())
				case <-time.After(2 * ttl):
				}
				require.NoError(t, held.Err())
				assert.Greater(t, events.Count(pglease.EventExtended), before+2, "heartbeat rounds ran")
				assert.Zero(t, events.Count(pglease.EventHeartbeatFailed))
				if locked {
					require.NoError(t, tx.Commit(ctx))
				}
				for range leases {
					err := <-unlocked
					if locked && errors.Is(err, pglease.ErrLost) {
						continue // its row stayed locked past its expiry: lapsed, as reported
					}
					require.NoError(t, err, "each Unlock releases its row while the jobs hold the pool")
				}
				for _, lease := range leases {
					row, _ := pgtest.ReadRow(t, direct, table, lease.Key())
					assert.False(t, row.Live, "row %q released", lease.Key())
				}
				stop()
				require.NoError(t, l.Close(ctx))
			})
		}
	})

	t.Run("LossWaitingForANewOneNamesTheWait", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		app := pgtest.AppName("starvedloss")
		pool := sharedPool(t, app)
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHook(events.Hook), pglease.WithKeptConnection())
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		events.WaitFor(t, pglease.EventExtended, ttl)

		// Jobs take every connection and queue for more; then the heartbeat's
		// own connection dies, and the pool's next one goes to a queued job.
		size := int(pool.Stat().MaxConns())
		hogPool(t, pool, size+1)
		require.Eventually(t, func() bool { return pool.Stat().AcquiredConns() == int32(size) }, 5*time.Second, 5*time.Millisecond)
		// The heartbeat's connection is the one whose last statement was
		// the heartbeat's (sqlstmt.Heartbeat): a claim's or a release's
		// of a burst reads arrays too.
		var pid int32
		require.NoError(t, direct.QueryRow(ctx,
			`SELECT pid FROM pg_stat_activity WHERE application_name = $1 AND query LIKE '%AS h(key, fence, ttl)%'`, app).Scan(&pid))
		_, err = direct.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)

		requireLossNamesThePoolWait(t, lease, events, ttl)
	})

	// Guarantee: WithKeptConnection keeps one pooled connection for the
	// heartbeat and so makes it more reliable, not less. The kept
	// connection idles a full interval between rounds and is used without
	// the liveness check pgxpool gives a connection idle for over a second.
	// A server-side idle_session_timeout (or a firewall or pooler that
	// drops idle connections) shorter than the heartbeat interval then
	// closes it between every two rounds, and every full round fails; the
	// same Locker without the kept connection never fails a round. Worse,
	// Unlock and Close run on the kept connection when it is free: after
	// such an idle spell they fail, and the released keys stay held until
	// their expiry.
	t.Run("IdledPastTheServerTimeout", func(t *testing.T) {
		t.Parallel()
		for _, kept := range []bool{false, true} {
			name := "pool"
			if kept {
				name = "kept"
			}
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				table := pgtest.Table(t, pgtest.Pool(t, nil))
				pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
					cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "1200"
					cfg.MaxConns = 4
				})

				events := pgtest.NewEvents(t)
				opts := []pglease.Option{pglease.WithTTL(6 * time.Second), pglease.WithHeartbeatInterval(2500 * time.Millisecond), pglease.WithHook(events.Hook)}
				if kept {
					opts = append(opts, pglease.WithKeptConnection())
				}
				l := pgtest.Locker(t, pool, table, "a", opts...)
				unlocked, err := l.Claim(ctx, "unlocked")
				require.NoError(t, err)
				_, err = l.Claim(ctx, "closed")
				require.NoError(t, err)
				for range 2 {
					events.WaitFor(t, pglease.EventExtended, 5*time.Second)
				}
				// Releases run on the kept connection too: one sent after it
				// idled past the timeout, between two rounds, fails, and the
				// key stays held until its expiry.
				time.Sleep(1600 * time.Millisecond) // the point: the connection idles past idle_session_timeout, before the next round (2.5s)
				uerr := unlocked.Unlock(ctx)
				events.WaitFor(t, pglease.EventExtended, 5*time.Second)
				time.Sleep(1600 * time.Millisecond) // idle past the timeout again, now before Close's release
				cerr := l.Close(ctx)
				var failure error
				for _, ev := range events.All() {
					if ev.Kind == pglease.EventHeartbeatFailed && failure == nil {
						failure = ev.Err
					}
				}
				assert.NoError(t, uerr, "Unlock after the kept connection idled")
				assert.NoError(t, cerr, "Close after the kept connection idled")
				for _, key := range []string{"unlocked", "closed"} {
					row, _ := pgtest.ReadRow(t, pool, table, key)
					assert.False(t, row.Live, "row %q still held until its expiry after its release", key)
				}
				assert.Zero(t, events.Count(pglease.EventHeartbeatFailed), "failed heartbeat rounds; first: %v", failure)
			})
		}
	})

	t.Run("WithoutItTheLossNamesThePoolWait", func(t *testing.T) {
		t.Parallel()
		ctx, _, table := pgtest.Setup(t)
		pool := sharedPool(t, pgtest.AppName("starvednamed")) // the README's setup, no option
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		size := int(pool.Stat().MaxConns())
		hogPool(t, pool, size)
		requireLossNamesThePoolWait(t, lease, events, ttl)
	})

	// Guarantee: claims waiting on rows locked elsewhere never take the last
	// connection of the Locker's pool: with pgxpool's default size on a small
	// machine (4 connections), as README sets it up, claims of more keys than
	// that, all waiting on row locks for several TTLs, leave the heartbeat its
	// connection, and a held lease survives.
	t.Run("WithoutItWaitingClaimsLeaveTheHeartbeatAConnection", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) { c.MaxConns = 4 })
		table := pgtest.Table(t, pool)
		locker := pgtest.PoolWith(t, pgtest.Server.DSN(), nil)
		const ttl = 2 * time.Second
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl))
		held, err := l.Claim(ctx, "held")
		require.NoError(t, err)

		keys := []string{"k1", "k2", "k3", "k4", "k5", "k6"}
		old := pgtest.Locker(t, locker, table, "old")
		for _, k := range keys {
			lease, err := old.Claim(ctx, k)
			require.NoError(t, err)
			require.NoError(t, lease.Unlock(ctx))
		}
		tx := pgtest.LockRows(t, locker, table, `key LIKE 'k%'`)
		cctx, cancel := context.WithTimeout(ctx, 4*ttl)
		defer cancel()
		var wg sync.WaitGroup
		for _, k := range keys {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if lease, err := l.Claim(cctx, k); err == nil {
					_ = lease.Unlock(ctx)
				}
			}()
		}
		select {
		case <-held.Done():
			t.Fatalf("the held lease was lost while claims waited on locked rows: %v", held.Err())
		case <-time.After(3 * ttl):
		}
		require.NoError(t, held.Err())
		require.NoError(t, tx.Rollback(ctx))
		wg.Wait()
	})
}

// sharedPool is the README's setup: one pgxpool of the default size for the
// jobs and the Locker, its backends named app. Closed at cleanup.
func sharedPool(t *testing.T, app string) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["application_name"] = app })
}

// hogPool starts n jobs that each take a connection of pool and keep it
// until the returned function is called, which waits for them to give it
// back. Jobs that find the pool full wait in its queue.
func hogPool(t *testing.T, pool *pgxpool.Pool, n int) (stop func()) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range n {
		wg.Go(func() {
			conn, err := pool.Acquire(ctx)
			if err != nil {
				return // stopped while waiting
			}
			<-ctx.Done()
			conn.Release()
		})
	}
	var once sync.Once
	stop = func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return stop
}

// requireLossNamesThePoolWait waits for lease to be lost and checks that
// the loss, its event and a heartbeat failure name the wait for a pool
// connection.
func requireLossNamesThePoolWait(t *testing.T, lease *pglease.Lease, events *pgtest.Events, ttl time.Duration) {
	t.Helper()
	pgtest.WaitDone(t, lease, 3*ttl)
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	assert.Regexp(t, `waited [0-9.]+m?s for a connection from the pool \(\d+ of \d+ in use\)`, lease.Err().Error(),
		"the loss names the wait for a pool connection, not a database failure")
	var lost, failed []string
	require.Eventually(t, func() bool {
		lost, failed = eventErrs(events, pglease.EventLost), eventErrs(events, pglease.EventHeartbeatFailed)
		return len(lost) > 0 && slices.ContainsFunc(failed, waitNamed)
	}, 2*ttl, 5*time.Millisecond, "a heartbeat failure names the wait for a pool connection; lost %q, heartbeat failures %q", lost, failed)
	require.Len(t, lost, 1)
	assert.True(t, waitNamed(lost[0]), "the EventLost error names the wait: %s", lost[0])
	t.Logf("figures: lost: %s", lost[0])
}

func waitNamed(msg string) bool { return containsAll(msg, "waited", "for a connection from the pool") }

// eventErrs lists the errors of the events of kind so far.
func eventErrs(e *pgtest.Events, kind pglease.EventKind) []string {
	var out []string
	for _, ev := range e.All() {
		if ev.Kind == kind && ev.Err != nil {
			out = append(out, ev.Err.Error())
		}
	}
	return out
}

func containsAll(s string, parts ...string) bool {
	for _, p := range parts {
		if !strings.Contains(s, p) {
			return false
		}
	}
	return true
}
