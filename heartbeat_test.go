package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestHeartbeat pins the heartbeat: it extends every lease in one
// statement per round, skips locked rows without losing them, and loses a
// lease at its trust deadline, naming why.
func TestHeartbeat(t *testing.T) {
	t.Parallel()
	// Guarantee: a heartbeat round gives each lease its own row's report:
	// leases of jobs whose TTLs are 3 s apart share the round, each keeps
	// its own row's expiry, and revoked, force-expired, taken and locked
	// rows among them at random places are each lost (or skipped, while
	// locked) for their own row's state, with one EventLost each.
	t.Run("ReportsEachLeasesOwnRow", testHeartbeatReportsEachLeasesOwnRow)
	// Guarantee: a heartbeat round whose commit's wait for a synchronous
	// standby was cut short (its context ended, and the driver sent a
	// cancel request: lib/pq, or pgx configured to) extends no lease: the
	// trust window does not move, and each lease is lost at the deadline
	// its last confirmed round set.
	t.Run("UnreplicatedRoundExtendsNothing", testHeartbeatUnreplicated)
	// Guarantee: a round's read of why a lease was lost, given up at its
	// own timeout while the round goes on, closes the round's connection:
	// the cancel request pgx sent for it never reaches a later claim
	// there (with a synchronous standby, it would cut that claim's wait).
	t.Run("LossReadCancelRequestNeverReachesALaterClaim", testHeartbeatLossReadCancel)
	// Guarantee: a held lease survives bursts of Unlocks on a pool of
	// few connections without a kept connection. Each release takes its
	// pool connection before its turn at the gate, where a waiting round
	// goes first; the round takes its own before its turn too, so it never
	// waits at the gate for a connection the releases behind it hold.
	for _, size := range []int32{2, 3} {
		t.Run(fmt.Sprintf("KeepsTheLeaseThroughBurstsOfUnlocks/pool=%d", size), func(t *testing.T) {
			t.Parallel()
			ctx, _, table := pgtest.Setup(t)
			pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.MaxConns = size })
			l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second))
			held, err := l.Claim(ctx, "held")
			require.NoError(t, err)
			for burst, stop := 0, time.Now().Add(3*time.Second); time.Now().Before(stop); burst++ {
				leases := make([]*pglease.Lease, 30)
				for i := range leases {
					leases[i], err = l.Claim(ctx, fmt.Sprintf("job-%d-%d", burst, i))
					require.NoError(t, err)
				}
				var wg sync.WaitGroup
				for _, lease := range leases {
					wg.Go(func() { assert.NoError(t, lease.Unlock(ctx)) })
				}
				wg.Wait()
				require.NoError(t, held.Err(), "the held lease, after burst %d of 30 Unlocks", burst)
			}
		})
	}
	t.Run("KeepsTheLeaseAcrossTTLs", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = 600 * time.Millisecond
		events := pgtest.NewEvents(t)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(150*time.Millisecond), pglease.WithHook(events.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl))
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		firstExpiry := lease.ExpiresAt()

		// Keep claiming from b until the lease has been extended past 4 TTLs.
		attempts := 0
		for {
			_, err := b.Claim(ctx, "k")
			require.ErrorIs(t, err, pglease.ErrHeld, "attempt %d", attempts)
			attempts++
			if lease.ExpiresAt().Sub(firstExpiry) > 4*ttl {
				break
			}
			select {
			case <-lease.Done():
				t.Fatalf("lease lost: %v", lease.Err())
			default:
			}
			events.WaitFor(t, pglease.EventExtended, 2*ttl)
		}
		require.NoError(t, lease.Err())
		assert.Greater(t, events.Count(pglease.EventExtended), 4)
		assert.Zero(t, events.Count(pglease.EventLost))
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		assert.Equal(t, lease.Fence(), row.Fence, "heartbeats never change the fence")
	})

	t.Run("OneStatementPerRound", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		const n = 50
		for i := range n {
			_, err := l.Claim(ctx, fmt.Sprintf("k%02d", i))
			require.NoError(t, err)
		}
		// A first full round: rounds that started while the claims were still
		// running extend fewer leases.
		for events.WaitFor(t, pglease.EventExtended, 5*time.Second).Leases < n {
		}
		counter.Reset()
		before := events.Count(pglease.EventExtended)
		for range 3 {
			ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second)
			assert.Equal(t, n, ev.Leases, "every lease in each round")
		}
		rounds := events.Count(pglease.EventExtended) - before
		statements := counter.Count("heartbeat")
		assert.InDelta(t, rounds, statements, 1, "one statement per round (%d rounds, %d statements)", rounds, statements)
		assert.Equal(t, 0, counter.Count("other"))
	})

	t.Run("DetectsAStolenRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		jobCtx, cancel := lease.Context(ctx)
		defer cancel()

		_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = 'thief', fence = nextval(%s), expires_at = clock_timestamp() + interval '1 hour' WHERE key = 'k'`,
			pgx.Identifier{table}.Sanitize(), "'"+pgx.Identifier{table + "_fence_seq"}.Sanitize()+"'"))
		require.NoError(t, err)
		stolen, _ := pgtest.ReadRow(t, pool, table, "k")

		pgtest.WaitDone(t, lease, ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.ErrorIs(t, context.Cause(jobCtx), pglease.ErrLost, "the job's context is cancelled with the cause")
		ev := events.WaitFor(t, pglease.EventLost, time.Second)
		assert.Equal(t, "k", ev.Key)
		assert.Equal(t, lease.Fence(), ev.Fence)
		assert.Equal(t, l.Holder(), ev.Holder)
		_, ok := l.Held("k")
		assert.False(t, ok)

		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
		after, _ := pgtest.ReadRow(t, pool, table, "k")
		assert.Equal(t, stolen, after, "the thief's row is untouched")
	})

	t.Run("RetriesThroughAShortOutage", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		events.WaitFor(t, pglease.EventExtended, 2*time.Second)

		db.SetFail("heartbeat", errors.New("connection refused"))
		for range 3 {
			events.WaitFor(t, pglease.EventHeartbeatFailed, 2*time.Second)
		}
		db.SetFail("heartbeat", nil)
		events.WaitFor(t, pglease.EventExtended, 2*time.Second)
		require.NoError(t, lease.Err(), "an outage shorter than the trust window loses nothing")
		assert.GreaterOrEqual(t, events.Count(pglease.EventHeartbeatFailed), 3)
	})

	t.Run("LosesAtTheTrustDeadline", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		const ttl = time.Second
		l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond))
		other := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl))
		db.SetFail("heartbeat", errors.New("network unreachable"))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		// Ask the lease as often as possible; remember the last moment it still
		// said it was held.
		var lastTrusted time.Time
		give := time.After(2 * ttl)
		for {
			asked := time.Now()
			if lease.Err() != nil {
				break
			}
			lastTrusted = asked
			select {
			case <-give:
				t.Fatal("the lease was never declared lost")
			default:
			}
		}
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.Contains(t, lease.Err().Error(), "trust deadline")
		// Same machine, same wall clock: the holder stopped believing before the
		// server would let anyone else in.
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		require.True(t, lastTrusted.Before(row.ExpiresAt), "trusted locally until %v, server expiry %v", lastTrusted, row.ExpiresAt)
		t.Logf("local trust ended %v before the server expiry", row.ExpiresAt.Sub(lastTrusted))

		// Once the server expiry passes, another replica takes over.
		require.Eventually(t, func() bool {
			next, err := other.Claim(ctx, "k")
			return err == nil && next.Fence() > lease.Fence()
		}, 3*ttl, 20*time.Millisecond)
	})

	t.Run("UnlockWaitsForTheRoundInFlight", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		const ttl, minHold = 3 * time.Second, 2 * time.Second
		l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithMinHold(minHold))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		open := db.Hold("heartbeat")
		defer open()
		require.Equal(t, "heartbeat", <-db.Entered, "a heartbeat round is in flight")
		unlocked := make(chan error, 1)
		go func() { unlocked <- lease.Unlock(ctx) }()
		select {
		case err := <-unlocked:
			t.Fatalf("Unlock returned (%v) while a heartbeat round was in flight", err)
		case <-time.After(200 * time.Millisecond):
		}
		open() // the round completes and extends the lease by a full TTL...
		require.NoError(t, <-unlocked)
		// ...and the release, ordered after it, brings it back to the min hold.
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		assert.Equal(t, lease.AcquiredAt().Add(minHold).UnixMicro(), row.ExpiresAt.UnixMicro(),
			"expires at acquired_at + min hold, not re-armed by the heartbeat")
	})

	t.Run("SurvivesAShortServerRestart", func(t *testing.T) {
		t.Parallel()
		ctx, srv, pool, table := pgtest.PrivateSetup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(8*time.Second), pglease.WithHeartbeatInterval(500*time.Millisecond), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		for _, mode := range []pgserver.Mode{pgserver.Fast, pgserver.Immediate} {
			require.NoError(t, srv.Restart(ctx, mode))
			before := events.Count(pglease.EventExtended)
			require.Eventually(t, func() bool { return events.Count(pglease.EventExtended) > before+1 }, 8*time.Second, 20*time.Millisecond,
				"heartbeats resume after a %s restart", mode)
			require.NoError(t, lease.Err(), "%s restart shorter than the TTL", mode)
		}
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		assert.Equal(t, lease.Fence(), row.Fence)
		next, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		assert.Greater(t, next.Fence(), lease.Fence(), "no fence goes backwards across restarts")
	})

	t.Run("LosesWhenTheServerStaysDown", func(t *testing.T) {
		t.Parallel()
		ctx, srv, pool, table := pgtest.PrivateSetup(t)
		const ttl = 1500 * time.Millisecond
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(300*time.Millisecond))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		require.NoError(t, srv.Stop(pgserver.Immediate))
		pgtest.WaitDone(t, lease, 2*ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.NoError(t, srv.Start(ctx))

		other := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl))
		require.Eventually(t, func() bool {
			next, err := other.Claim(ctx, "k")
			return err == nil && next.Fence() > lease.Fence()
		}, 10*time.Second, 50*time.Millisecond, "another holder takes over with a greater fence")
		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost, "the old mandate's release touches nothing")
	})

	// A row pinned with expires_at = 'infinity' (the CHECK allows it: an
	// operator keeping a key forever) is still one of its holder's leases: the
	// heartbeat round goes on extending every lease, the pinned one included,
	// without ever moving its expiry back, and reports that expiry as the
	// latest instant a timestamptz holds. One such row costs no other lease.
	t.Run("RowPinnedToInfinity", func(t *testing.T) {
		t.Parallel()
		for _, fenced := range []bool{true, false} {
			t.Run(fmt.Sprintf("fenced=%v", fenced), func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				pool, table, opts := leaseTable(t, fenced)
				const ttl = time.Second
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, pool, table, "a", append(opts, pglease.WithTTL(ttl),
					pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))...)
				pinned, err := l.Claim(ctx, "pinned")
				require.NoError(t, err)
				other, err := l.Claim(ctx, "other")
				require.NoError(t, err)
				for events.WaitFor(t, pglease.EventExtended, 5*time.Second).Leases < 2 { // a round of both
				}
				_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = 'infinity' WHERE key = 'pinned'`, pgx.Identifier{table}.Sanitize()))
				require.NoError(t, err)

				// Rounds until both leases have lived past two TTLs from the pin.
				since, before := time.Now(), other.ExpiresAt()
				for time.Since(since) < 2*ttl {
					ev := events.WaitFor(t, pglease.EventExtended, ttl)
					if ev.Leases != 2 {
						t.Fatalf("a round extended %d leases, not 2", ev.Leases)
					}
				}
				require.NoError(t, pinned.Err())
				require.NoError(t, other.Err())
				assert.Zero(t, events.Count(pglease.EventHeartbeatFailed), "no round failed")
				assert.True(t, other.ExpiresAt().After(before), "the other lease was extended")
				assert.Greater(t, pinned.ExpiresAt().Year(), 294275, "the pinned lease reports the latest instant a timestamptz holds: %v", pinned.ExpiresAt())

				var infinite bool
				require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT expires_at = 'infinity' FROM %s WHERE key = 'pinned'`,
					pgx.Identifier{table}.Sanitize())).Scan(&infinite))
				assert.True(t, infinite, "the heartbeat never moves an expiry back")
				admin := adminOf(t, pool, pglease.WithTable(table))
				rows, err := admin.List(ctx)
				require.NoError(t, err)
				require.Len(t, rows, 2)
				assert.True(t, rows[1].NeverExpires)
				assert.True(t, rows[1].ExpiresAt.Equal(pinned.ExpiresAt()), "List reads the pinned row's expiry as the heartbeat reports it")

				require.NoError(t, pinned.Unlock(ctx), "its holder releases it as any other")
				rows, err = admin.List(ctx)
				require.NoError(t, err)
				assert.False(t, rows[1].Live, "released: %+v", rows[1])
			})
		}
	})

	// Guarantee: under a generic plan (plan_cache_mode = force_generic_plan, as
	// a server or role may set, and as PostgreSQL chooses by itself after five
	// executions of a prepared statement), the heartbeat tells locked rows from
	// lost ones whatever the number of locked rows: none, one, all. A locked
	// lease is skipped, never lost, until its own trust deadline, and extended
	// again once the lock is gone.
	t.Run("GenericPlanSkipsLockedRows", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		generic := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
			cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
			cfg.MaxConns = 4
		})

		events := pgtest.NewEvents(t)
		const ttl = 4 * time.Second
		l := pgtest.Locker(t, generic, table, "g", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
		keys := []string{"a", "b", "c", "d"}
		leases := make(map[string]*pglease.Lease)
		for _, k := range keys {
			ls, err := l.Claim(ctx, k)
			require.NoError(t, err)
			leases[k] = ls
		}
		expiry := func(k string) time.Time { r, _ := pgtest.ReadRow(t, direct, table, k); return r.ExpiresAt }
		extendedPast := func(k string, at time.Time) {
			t.Helper()
			require.Eventually(t, func() bool { return expiry(k).After(at) }, 3*time.Second, 10*time.Millisecond, "%s extended", k)
		}
		// Many rounds with no row locked: the generic plan is in use.
		for range 8 {
			events.WaitFor(t, pglease.EventExtended, 2*time.Second)
		}
		for _, locked := range [][]string{{"b"}, keys, {}} {
			ends := make([]func(bool), 0, len(locked))
			frozen := map[string]time.Time{}
			for _, k := range locked {
				ends = append(ends, pgtest.LockRow(t, direct, table, k))
				frozen[k] = expiry(k)
			}
			// Ten rounds with these rows locked: the others keep being extended.
			for _, k := range keys {
				if _, isLocked := frozen[k]; !isLocked {
					extendedPast(k, expiry(k))
				}
			}
			for range 10 {
				events.WaitFor(t, pglease.EventExtended, 2*time.Second)
			}
			for k, at := range frozen {
				require.Equal(t, at, expiry(k), "%s locked: not extended", k)
			}
			for _, k := range keys {
				require.NoError(t, leases[k].Err(), "%s held with %v locked", k, locked)
			}
			for _, end := range ends {
				end(false)
			}
			for _, k := range keys {
				extendedPast(k, expiry(k))
			}
		}
		require.Zero(t, events.Count(pglease.EventLost), "no lease lost, %d heartbeat failures", events.Count(pglease.EventHeartbeatFailed))
	})

	// Guarantee: one locked row costs nothing it need not. The heartbeat
	// locks its rows FOR UPDATE SKIP LOCKED. FOR UPDATE conflicts with FOR
	// KEY SHARE, the lock every foreign key check takes on the referenced
	// row, while the UPDATE itself (it changes no key column) takes only
	// FOR NO KEY UPDATE, which does not. A job that, in its own
	// transaction, writes a row referencing its lease's key (an audit or
	// run table with a foreign key to the lease table) makes its own lease
	// be skipped round after round, and lost at its trust deadline,
	// although extending it would not have waited at all.
	t.Run("ExtendsAKeyShareLockedRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tbl := pgx.Identifier{table}.Sanitize()
		child := pgx.Identifier{table + "_runs"}.Sanitize()
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id bigserial PRIMARY KEY, lease_key text NOT NULL REFERENCES %s (key))`, child, tbl))
		require.NoError(t, err)

		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		// The job records its run in its own transaction, left open while it
		// works: the foreign key check holds FOR KEY SHARE on the lease's row.
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (lease_key) VALUES ('k')`, child))
		require.NoError(t, err)

		// Proof that extending the row does not have to wait: the heartbeat's
		// own UPDATE, run alone, goes through at once.
		probe, err := pool.Begin(ctx)
		require.NoError(t, err)
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err = probe.Exec(pctx, fmt.Sprintf(`UPDATE %s SET expires_at = expires_at + interval '1 second' WHERE key = 'k'`, tbl))
		cancel()
		require.NoError(t, err, "an UPDATE of expires_at does not wait on FOR KEY SHARE")
		require.NoError(t, probe.Rollback(ctx))

		// The job runs for three TTLs; its lease must stay held throughout.
		deadline := time.Now().Add(3 * ttl)
		for time.Now().Before(deadline) {
			select {
			case <-lease.Done():
				t.Fatalf("lease lost while its row was only FOR KEY SHARE locked (extended %d rounds): %v",
					events.Count(pglease.EventExtended), lease.Err())
			case <-time.After(50 * time.Millisecond):
			}
		}
		require.NoError(t, lease.Err())
		require.NoError(t, tx.Commit(ctx))
	})

	// Guarantee: a loss names its cause, also where skipping locked rows
	// ends: SKIP LOCKED skips row locks, not a table lock. An operator's
	// LOCK TABLE (or an ALTER TABLE queued behind a long query) holds every
	// heartbeat round, and every lease of the Locker is lost at its trust
	// deadline, with the database up and the pool idle. The loss must say
	// what held the heartbeat (a round in flight, waiting on the server),
	// not read like a plain silence of the heartbeat.
	t.Run("TableLockLossNamesTheRoundInFlight", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = time.Second
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
		var leases []*pglease.Lease
		for _, key := range []string{"a", "b", "c"} {
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		_, end := pgtest.LockTable(t, pool, table)
		defer end(false)
		for _, lease := range leases {
			pgtest.WaitDone(t, lease, 3*ttl)
			require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		}
		msg := leases[0].Err().Error()
		require.Regexp(t, `(?i)in flight|lock|no reply|outstanding`, msg, "the loss names what held the heartbeat")
	})

	// Guarantee: on a single connection too (a *pgx.Conn), a claim of a row
	// another transaction has locked never holds the heartbeat up: the held
	// lease of another key stays alive while that claim waits, and the claim
	// of a free key goes through meanwhile (claims of locked rows leave a
	// connection to the others; here there is one).
	t.Run("SingleConnectionNotHeldByAClaimOfALockedRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		app := pgtest.AppName("singlelocked")
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		cfg.RuntimeParams["application_name"] = app
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		const ttl = time.Second
		l := pgtest.Locker(t, conn, table, "single", pglease.WithTTL(ttl))
		held, err := l.Claim(ctx, "held")
		require.NoError(t, err)
		freeRow(ctx, t, pool, table, "locked")
		end := pgtest.LockRow(t, pool, table, "locked")
		t.Cleanup(func() { end(false) })
		wctx, cancel := context.WithTimeout(ctx, 4*ttl)
		defer cancel()
		waiting := make(chan error, 1)
		go func() {
			lease, err := l.Claim(wctx, "locked")
			if err == nil {
				err = lease.Unlock(ctx)
			}
			waiting <- err
		}()
		pgtest.LockWaiter(t, pool, app, "pglease.synchronous_commit", 5*time.Second)
		fctx, fcancel := context.WithTimeout(ctx, ttl)
		defer fcancel()
		free, ferr := l.Claim(fctx, "free")
		select {
		case <-held.Done():
			t.Errorf("lease lost while a claim of a locked row waits on the one connection: %v", held.Err())
		case <-time.After(2 * ttl):
		}
		end(true)
		t.Logf("the claim of the locked row, once unlocked: %v", <-waiting)
		require.NoError(t, ferr, "the claim of a free key while a claim of a locked row waits")
		if free != nil {
			_ = free.Unlock(ctx)
		}
	})

	// Guarantee: DB's documentation says a *pgx.Conn satisfies it, and a Locker
	// on one works. A *pgx.Conn runs one statement at a time and is not safe
	// for concurrent use, while a Locker sends statements from its heartbeat
	// goroutine and from every caller of Claim and Unlock (gocron calls Lock
	// and Unlock from a goroutine per job). Claims and releases made while the
	// heartbeat runs must neither fail with "conn busy" nor race on the
	// connection's buffers, and no lease may be lost while the server is fine.
	t.Run("SharesASingleConnection", func(t *testing.T) {
		t.Parallel()
		ctx, _, table := pgtest.Setup(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })

		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, conn, table, "single", pglease.WithTTL(2*time.Second),
			pglease.WithHeartbeatInterval(5*time.Millisecond), pglease.WithHook(events.Hook))
		// One lease held throughout keeps the heartbeat busy.
		held, err := l.Claim(ctx, "held")
		require.NoError(t, err)

		var failures []error
		for i := range 300 {
			lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i%5))
			if err != nil {
				failures = append(failures, fmt.Errorf("claim %d: %w", i, err))
				continue
			}
			if err := lease.Unlock(ctx); err != nil {
				failures = append(failures, fmt.Errorf("unlock %d: %w", i, err))
			}
		}
		t.Logf("figures: 300 claim+unlock on one *pgx.Conn with a 5ms heartbeat: %d failed, %d heartbeat rounds failed, %d leases lost",
			len(failures), events.Count(pglease.EventHeartbeatFailed), events.Count(pglease.EventLost))
		if len(failures) > 0 {
			t.Errorf("claims and releases on a *pgx.Conn while the heartbeat runs: %d of 300 failed, first: %v", len(failures), failures[0])
		}
		require.Zero(t, events.Count(pglease.EventHeartbeatFailed), "heartbeat rounds failed on a *pgx.Conn")
		require.NoError(t, held.Err())
	})

	t.Run("RowLockedPastTheTrustWindowCostsOnlyIt", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		locked, err := l.Claim(ctx, "locked")
		require.NoError(t, err)
		var others []*pglease.Lease
		for _, key := range []string{"b", "c"} {
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			others = append(others, lease)
		}
		extendedPast := func(lease *pglease.Lease, limit time.Duration) {
			t.Helper()
			from := lease.ExpiresAt()
			require.Eventually(t, func() bool { return lease.ExpiresAt().After(from) }, limit, 5*time.Millisecond,
				"lease %q extended", lease.Key())
		}

		// A lock shorter than the trust window: the row is skipped, retried,
		// and extended again once free; nothing is lost.
		end := pgtest.LockRow(t, pool, table, "locked")
		lockedUntil := locked.ExpiresAt()
		for range 3 {
			extendedPast(others[0], ttl)
		}
		require.NoError(t, locked.Err(), "a locked row is not a lost one")
		assert.Equal(t, lockedUntil, locked.ExpiresAt(), "the locked row is skipped, not waited for")
		end(false)
		extendedPast(locked, ttl)

		// A lock past the trust window: that lease alone is lost.
		end = pgtest.LockRow(t, pool, table, "locked")
		pgtest.WaitDone(t, locked, 2*ttl)
		require.ErrorIs(t, locked.Err(), pglease.ErrLost)
		for _, lease := range others {
			require.NoError(t, lease.Err(), "lease %q of the same Locker", lease.Key())
			extendedPast(lease, ttl)
		}
		end(false)
		for _, lease := range others {
			extendedPast(lease, ttl)
			require.NoError(t, lease.Err())
		}
		assert.Equal(t, 1, events.Count(pglease.EventLost))
	})

	t.Run("RetriesRowsAnotherClaimLocked", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		events := pgtest.NewEvents(t)
		const interval = 50 * time.Millisecond
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook))
		var leases []*pglease.Lease
		for i := range 10 {
			lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		// Other replicas try the same keys all the time, as gocron's replicas
		// do at every tick: each claim locks the row it finds held.
		others := pgtest.Locker(t, pool, table, "b")
		stop := make(chan struct{})
		var wg sync.WaitGroup
		for w := range 2 {
			wg.Go(func() {
				for i := w; ; i++ {
					select {
					case <-stop:
						return
					default:
					}
					_, err := others.Claim(ctx, fmt.Sprintf("k%d", i%10))
					if !errors.Is(err, pglease.ErrHeld) {
						t.Errorf("claim of a held key: %v", err)
						return
					}
				}
			})
		}
		counter.Reset()
		time.Sleep(2 * time.Second) // the scenario: two seconds of claims contending with the rounds
		close(stop)
		wg.Wait()
		for _, lease := range leases {
			require.NoError(t, lease.Err())
		}
		rounds := events.Count(pglease.EventExtended) + events.Count(pglease.EventHeartbeatFailed)
		t.Logf("figures: 2 s of claims contending with 10 leases: %d rounds (interval %v), %d heartbeat statements, %d claims",
			rounds, interval, counter.Count("heartbeat"), counter.Count("claim"))
		assert.InDelta(t, rounds, counter.Count("heartbeat"), 2, "one statement per round")
		assert.Zero(t, counter.Count("other"))
	})

	t.Run("CommitsSynchronously", func(t *testing.T) {
		t.Parallel()
		for _, mode := range []string{"fenced", "without fence column"} {
			t.Run(mode, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				pool, table, opts := leaseTable(t, mode == "fenced")
				opts = append(opts, pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(20*time.Millisecond))
				for setting, want := range map[string]string{
					"off": "on", "local": "on", "remote_write": "remote_write", "on": "on", "remote_apply": "remote_apply",
				} {
					events := pgtest.NewEvents(t)
					spy := &syncSpyDB{DB: pool, pool: pool, setting: setting}
					l := pgtest.Locker(t, spy, table, "a-"+setting, append(opts, pglease.WithHook(events.Hook))...)
					_, err := l.Claim(ctx, "k-"+setting)
					require.NoError(t, err)
					ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second)
					require.Equal(t, 1, ev.Leases)
					require.NoError(t, l.Close(ctx))
					spy.mu.Lock()
					require.NotEmpty(t, spy.atCommit)
					assert.Equal(t, want, spy.atCommit[0], "synchronous_commit at commit when the default is %s", setting)
					spy.mu.Unlock()
				}
			})
		}
	})

	t.Run("ServerClockSteppedBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = 2 * time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(50*time.Millisecond),
			pglease.WithMinHold(0), pglease.WithHook(events.Hook))
		stepped, err := l.Claim(ctx, "stepped")
		require.NoError(t, err)
		other, err := l.Claim(ctx, "other")
		require.NoError(t, err)

		// The row as the claim wrote it before the server's clock stepped back
		// an hour: acquired_at and expires_at lie an hour in the server's future.
		_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET acquired_at = clock_timestamp() + interval '1 hour',
		expires_at = clock_timestamp() + interval '1 hour' + make_interval(secs => $1) WHERE key = 'stepped'`,
			pgx.Identifier{table}.Sanitize()), ttl.Seconds())
		require.NoError(t, err)

		before := events.Count(pglease.EventExtended)
		from := other.ExpiresAt()
		require.Eventually(t, func() bool { return events.Count(pglease.EventExtended) >= before+5 }, 5*time.Second, 5*time.Millisecond)
		for _, ev := range eventsOf(events, pglease.EventHeartbeatFailed) {
			var pgErr *pgconn.PgError
			require.False(t, errors.As(ev.Err, &pgErr) && pgErr.Code == "23514", "CHECK violation: %v", ev.Err)
			t.Fatalf("heartbeat failed: %v", ev.Err)
		}
		require.NoError(t, other.Err())
		require.NoError(t, stepped.Err())
		assert.True(t, other.ExpiresAt().After(from), "the other lease is extended in the same rounds")

		require.NoError(t, stepped.Unlock(ctx), "release after the step")
		row, _ := pgtest.ReadRow(t, pool, table, "stepped")
		assert.True(t, row.ExpiresAt.After(row.AcquiredAt))
		require.NoError(t, other.Unlock(ctx))
	})

	t.Run("SlowRoundsKeepTheirPeriod", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		// Each round takes 3/4 of the interval. Timed from its end, a round
		// would start every 1.4 s and its reply would come 2 s after the
		// previous one was sent: past the trust window (2 s - 200 ms).
		const ttl, interval, delay = 2 * time.Second, 800 * time.Millisecond, 600 * time.Millisecond
		db := &slowDB{DB: pool, delay: delay}
		l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		const window = 5 * interval
		select {
		case <-lease.Done():
			t.Fatalf("lease lost although every round succeeds: %v", lease.Err())
		case <-time.After(window):
		}
		require.NoError(t, lease.Err())
		rounds := db.started()
		t.Logf("figures: %d rounds started in %v (interval %v, each round %v)", rounds, window, interval, delay)
		assert.GreaterOrEqual(t, rounds, 4, "rounds start every interval, however long they take")
	})
}

// syncSpyDB runs every heartbeat statement once more in a transaction it
// rolls back, under a given synchronous_commit, and records the setting the
// statement leaves for the commit.
type syncSpyDB struct {
	pglease.DB
	pool     pglease.DB
	setting  string
	mu       sync.Mutex
	atCommit []string
}

func (s *syncSpyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pgtest.StatementKind(sql) == "heartbeat" {
		if err := s.spy(ctx, sql, args); err != nil {
			return nil, fmt.Errorf("spy: %w", err)
		}
	}
	return s.DB.Query(ctx, sql, args...)
}

func (s *syncSpyDB) spy(ctx context.Context, sql string, args []any) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", s.setting); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var got string
	if err := tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got); err != nil {
		return err
	}
	s.mu.Lock()
	s.atCommit = append(s.atCommit, got)
	s.mu.Unlock()
	return nil
}

// eventsOf returns the events of kind logged so far.
func eventsOf(e *pgtest.Events, kind pglease.EventKind) []pglease.Event {
	var out []pglease.Event
	for _, ev := range e.All() {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// slowDB delays every heartbeat statement by a fixed time before sending it,
// as a slow network or a loaded server would, and records when each started.
type slowDB struct {
	pglease.DB
	delay  time.Duration
	mu     sync.Mutex
	starts []time.Time
}

func (s *slowDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pgtest.StatementKind(sql) == "heartbeat" {
		s.mu.Lock()
		s.starts = append(s.starts, time.Now())
		s.mu.Unlock()
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.DB.Query(ctx, sql, args...)
}

func (s *slowDB) started() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.starts)
}

func testHeartbeatUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	dbs := unreplicatedDBs(ctx, t, pool)
	cancelRequest := pgtest.CancelRequestPool(t, srv.DSN(), nil)
	dbs["pool-cancel-request"] = lockerOn{db: cancelRequest}
	dbs["pool-cancel-request-kept"] = lockerOn{db: cancelRequest, opts: []pglease.Option{pglease.WithKeptConnection()}}
	const ttl = 3 * time.Second
	type round struct {
		sent   time.Time
		leases int
	}
	var (
		mu     sync.Mutex
		rounds = map[string][]round{}
		leases = map[string][]*pglease.Lease{}
	)
	for name, on := range dbs {
		hook := func(e pglease.Event) {
			if e.Kind == pglease.EventExtended {
				mu.Lock()
				rounds[name] = append(rounds[name], round{time.Now().Add(-e.Took), e.Leases})
				mu.Unlock()
			}
		}
		l := on.locker(t, table, name, pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(ttl/4), pglease.WithHook(hook))
		// Two leases of different TTLs: a round gives up at the earlier
		// trust deadline, and still has the later lease to extend.
		long, err := l.Job(pglease.WithTTL(2 * ttl))
		require.NoError(t, err)
		for _, c := range []interface {
			Claim(context.Context, string) (*pglease.Lease, error)
		}{l, long} {
			lease, err := c.Claim(ctx, fmt.Sprintf("%s-%d", name, len(leases[name])))
			require.NoError(t, err)
			leases[name] = append(leases[name], lease)
		}
	}
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	vanished := time.Now()
	for name := range dbs {
		t.Run(name, func(t *testing.T) {
			for _, lease := range leases[name] {
				pgtest.WaitDone(t, lease, 2*ttl+2*time.Second)
				require.ErrorIs(t, lease.Err(), pglease.ErrLost)
			}
			mu.Lock()
			defer mu.Unlock()
			for _, r := range rounds[name] {
				assert.False(t, r.sent.After(vanished) && r.leases > 0,
					"a round sent %v after the standby vanished extended %d leases", r.sent.Sub(vanished), r.leases)
			}
		})
	}
}

func testHeartbeatReportsEachLeasesOwnRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	for round := range 2 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			ev := pgtest.NewEvents(t)
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("h%d", round), pglease.WithTTL(12*time.Second),
				pglease.WithHeartbeatInterval(150*time.Millisecond), pglease.WithHook(ev.Hook))
			thief := fmt.Sprintf("o%d", round)
			ttls := []time.Duration{3 * time.Second, 6 * time.Second, 9 * time.Second, 12 * time.Second}
			jobs := make([]*pglease.JobLocker, len(ttls))
			for i, d := range ttls {
				jobs[i] = mustJob(t, l, pglease.WithTTL(d))
			}
			const n = 16
			type held struct {
				ls  *pglease.Lease
				ttl time.Duration
			}
			leases := make([]held, n)
			for _, i := range rand.Perm(n) {
				j := rand.IntN(len(jobs))
				ls, err := jobs[j].Claim(ctx, fmt.Sprintf("h%d-%02d", round, i))
				require.NoError(t, err)
				leases[i] = held{ls, ttls[j]}
			}
			perm := rand.Perm(n)
			revIdx, takenIdx, forcedIdx, lockedIdx, lockedRevIdx := perm[0], perm[1], perm[2], perm[3], perm[4]
			endLock := pgtest.LockRow(t, pool, table, leases[lockedIdx].ls.Key())
			// Another locked row, revoked by the transaction that locks it:
			// found so by a round of the locked leases alone.
			revTx, err := pool.Begin(ctx)
			require.NoError(t, err)
			endRev := pgtest.EndOnce(t, revTx)
			_, err = revTx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = $1 FOR UPDATE`, pgx.Identifier{table}.Sanitize()), leases[lockedRevIdx].ls.Key())
			require.NoError(t, err)
			_, err = admin.Revoke(ctx, leases[revIdx].ls.Key())
			require.NoError(t, err)
			// Taken in one statement, its fence drawn as a claim draws it: a
			// heartbeat round between an expiry and another holder's claim
			// would rightly find the row expired early by an operator.
			var theirs int64
			require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`UPDATE %s SET holder = $2, fence = nextval('%s') WHERE key = $1 RETURNING fence`, pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_fence_seq"}.Sanitize()),
				leases[takenIdx].ls.Key(), thief).Scan(&theirs))
			_, err = admin.ForceExpire(ctx, leases[forcedIdx].ls.Key())
			require.NoError(t, err)

			for _, i := range []int{revIdx, takenIdx, forcedIdx} {
				pgtest.WaitDone(t, leases[i].ls, 3*time.Second)
			}
			time.Sleep(600 * time.Millisecond) // several rounds, the locked row skipped in each
			require.NoError(t, leases[lockedIdx].ls.Err(), "a locked row is skipped, not lost")
			require.NoError(t, leases[lockedRevIdx].ls.Err(), "a locked row is skipped, not lost")
			_, err = revTx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = $2 WHERE key = $1`, pgx.Identifier{table}.Sanitize()), leases[lockedRevIdx].ls.Key(), sqlstmt.RevokedHolder)
			require.NoError(t, err)
			endRev(true)
			pgtest.WaitDone(t, leases[lockedRevIdx].ls, 3*time.Second)
			require.NoError(t, leases[lockedIdx].ls.Err(), "the other locked row still skipped")
			require.ErrorIs(t, leases[lockedRevIdx].ls.Err(), pglease.ErrRevoked)
			endLock(true)
			time.Sleep(400 * time.Millisecond)

			errRev := leases[revIdx].ls.Err()
			require.ErrorIs(t, errRev, pglease.ErrRevoked)
			require.Contains(t, errRev.Error(), "revoke marker")
			errTaken := leases[takenIdx].ls.Err()
			require.ErrorIs(t, errTaken, pglease.ErrLost)
			require.NotErrorIs(t, errTaken, pglease.ErrRevoked)
			require.Contains(t, errTaken.Error(), "holder "+thief)
			require.Contains(t, errTaken.Error(), fmt.Sprintf("fence %d", theirs))
			errForced := leases[forcedIdx].ls.Err()
			require.ErrorIs(t, errForced, pglease.ErrLost)
			require.NotErrorIs(t, errForced, pglease.ErrRevoked)
			require.Contains(t, errForced.Error(), "expired early by an operator")
			for _, err := range []error{errRev, errTaken, errForced} {
				require.Equal(t, 1, strings.Count(err.Error(), "pglease: "), "one prefix: %v", err)
			}

			for i, h := range leases {
				if i == revIdx || i == takenIdx || i == forcedIdx || i == lockedRevIdx {
					continue
				}
				require.NoError(t, h.ls.Err(), "lease %d", i)
				// The lease's expiry is its own row's, from its own TTL: read
				// its row, then the lease.
				row, ok := pgtest.ReadRow(t, pool, table, h.ls.Key())
				after := h.ls.ExpiresAt()
				require.True(t, ok)
				require.Equal(t, h.ls.Fence(), row.Fence)
				require.Equal(t, l.Holder(), row.Holder)
				require.InDelta(t, 0, after.Sub(row.ExpiresAt).Seconds(), 1.0,
					"lease %d (TTL %v): row expires %v, lease says %v", i, h.ttl, row.ExpiresAt, after)
				require.InDelta(t, h.ttl.Seconds(), time.Until(after).Seconds(), 1.5,
					"lease %d: its expiry is its own TTL from now", i)
			}
			// One loss event per lost lease, naming its key and fence.
			for _, i := range []int{revIdx, takenIdx, forcedIdx, lockedRevIdx} {
				var found []pglease.Event
				for _, x := range ev.All() {
					if x.Kind == pglease.EventLost && x.Key == leases[i].ls.Key() {
						found = append(found, x)
					}
				}
				require.Len(t, found, 1, "lease %d", i)
				require.Equal(t, leases[i].ls.Fence(), found[0].Fence)
				require.Equal(t, leases[i].ls.Err().Error(), found[0].Err.Error())
			}
			require.Zero(t, ev.Count(pglease.EventLost)-4, "no other lease lost")
		})
	}
}

// onStatement is a pgx tracer that calls before as each statement whose
// text is sql starts.
type onStatement struct {
	sql    string
	before func(conn *pgx.Conn)
}

func (o onStatement) TraceQueryStart(ctx context.Context, conn *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if data.SQL == o.sql {
		o.before(conn)
	}
	return ctx
}

func (onStatement) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func testHeartbeatLossReadCancel(t *testing.T) {
	t.Parallel()
	ctx, direct, table := pgtest.Setup(t)
	// Every cancel request lands 2.5 s late, and the reply to the round's
	// loss read comes 600 ms late, past the read's own 250 ms: pgx sends a
	// cancel request for it while the round's context is still live.
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
	pool := pgtest.CancelRequestPool(t, direct.Config().ConnString(), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 3
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false } // a late request finds the next statement
		cfg.ConnConfig.DialFunc = late.Dial(cfg.ConnConfig.DialFunc)
		cfg.ConnConfig.Tracer = onStatement{sql: renderSQL(sqlstmt.LostRows, table), before: func(c *pgx.Conn) { late.DelayNextReplyOf(c, 600*time.Millisecond) }}
	})
	l := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(20*time.Second), pglease.WithHeartbeatInterval(300*time.Millisecond))
	pglease.SetCoalesceAll(l, false)
	lease, err := l.Claim(ctx, "revoked")
	require.NoError(t, err)
	freeRow(ctx, t, direct, table, "locked")
	end := pgtest.LockRow(t, direct, table, "locked")
	defer end(false)
	_, err = adminOf(t, direct, pglease.WithTable(table)).Revoke(ctx, "revoked")
	require.NoError(t, err)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked lease was not lost")
	}
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	require.ErrorContains(t, lease.Err(), "reading which failed", "the loss says its read failed rather than naming one cause")
	require.Positive(t, late.Sent(), "the loss read outlasted its timeout and pgx sent a cancel request for it: the case is the one described")

	// A claim whose context never ends waits on the row lock until the
	// late cancel request has landed, and half a second more.
	claimPastLanded(ctx, t, l, late, end, "locked", "a heartbeat's loss read")
}
