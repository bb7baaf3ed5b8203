package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestHeartbeatKeepsTheLeaseAcrossSeveralTTLsWhileOthersGetErrHeld(t *testing.T) {
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
}

func TestHeartbeatExtendsEveryLeaseInOneStatementPerRound(t *testing.T) {
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
}

func TestRowStolenBehindTheLockersBackIsDetectedAsLostWithinOneTTL(t *testing.T) {
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
	assert.Equal(t, "a", ev.Holder)
	_, ok := l.Held("k")
	assert.False(t, ok)

	require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
	after, _ := pgtest.ReadRow(t, pool, table, "k")
	assert.Equal(t, stolen, after, "the thief's row is untouched")
}

func TestFailedHeartbeatsAreRetriedAndAShortOutageLosesNothing(t *testing.T) {
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
}

func TestLeaseIsLostAtItsTrustDeadlineBeforeTheServerExpiresIt(t *testing.T) {
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
}

func TestUnlockWaitsForTheHeartbeatInFlightSoItCannotBeReArmed(t *testing.T) {
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
}

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

func TestLeaseSurvivesAServerRestartShorterThanItsTTL(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	srv := privateServer(t)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	table := pgtest.Table(t, pool)
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
}

func TestLeaseIsLostWhenTheServerStaysDownPastItsTTL(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	srv := privateServer(t)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	table := pgtest.Table(t, pool)
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
}

// A row pinned with expires_at = 'infinity' (the CHECK allows it: an
// operator keeping a key forever) is still one of its holder's leases: the
// heartbeat round goes on extending every lease, the pinned one included,
// without ever moving its expiry back, and reports that expiry as the
// latest instant a timestamptz holds. One such row costs no other lease.
func TestARowPinnedToInfinityCostsNoLeaseOfItsHolder(t *testing.T) {
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
			list := append(slices.Clone(opts), pglease.WithTable(table))
			rows, err := pglease.List(ctx, pool, list...)
			require.NoError(t, err)
			require.Len(t, rows, 2)
			assert.True(t, rows[1].NeverExpires)
			assert.True(t, rows[1].ExpiresAt.Equal(pinned.ExpiresAt()), "List reads the pinned row's expiry as the heartbeat reports it")

			require.NoError(t, pinned.Unlock(ctx), "its holder releases it as any other")
			rows, err = pglease.List(ctx, pool, list...)
			require.NoError(t, err)
			assert.False(t, rows[1].Live, "released: %+v", rows[1])
		})
	}
}

// lockRow takes the row lock of key in another transaction, as a long
// report or a stuck migration would; the returned function ends that
// transaction (commit or rollback).
func lockRow(t *testing.T, db *pgxpool.Pool, table, key string) (end func(commit bool)) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	var fence int64
	require.NoError(t, tx.QueryRow(ctx, fmt.Sprintf(`SELECT fence FROM %s WHERE key = $1 FOR UPDATE`, pgx.Identifier{table}.Sanitize()), key).Scan(&fence))
	end = endOnce(t, tx)
	return end
}

// lockTable takes an EXCLUSIVE lock on table in another transaction, as a
// migration or an operator's LOCK TABLE would: reads go on, and every
// statement that locks or writes a row waits, the heartbeat included (it
// skips locked rows, but cannot skip a table lock). The returned function
// ends that transaction (commit or rollback).
func lockTable(t *testing.T, db *pgxpool.Pool, table string) (pgx.Tx, func(commit bool)) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`LOCK TABLE %s IN EXCLUSIVE MODE`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	end := endOnce(t, tx)
	return tx, end
}

// endOnce returns the function that ends tx, committing or rolling back,
// the first time it is called; a transaction not ended by the test is
// rolled back at cleanup.
func endOnce(t *testing.T, tx pgx.Tx) func(commit bool) {
	t.Helper()
	var once sync.Once
	end := func(commit bool) {
		once.Do(func() {
			if commit {
				require.NoError(t, tx.Commit(context.Background()))
			} else {
				require.NoError(t, tx.Rollback(context.Background()))
			}
		})
	}
	t.Cleanup(func() { end(false) })
	return end
}
