package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

var serializableSeq atomic.Int64

// serializableSetup is pgtest.Setup on a fresh database of the shared
// server whose default_transaction_isolation is serializable, as some
// operators set it: every statement of pglease then runs in a SERIALIZABLE
// transaction. It returns a context, a pool on that database and a lease
// table in it.
func serializableSetup(t *testing.T) (context.Context, *pgxpool.Pool, string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	name := fmt.Sprintf("serializable_%d", serializableSeq.Add(1))
	admin := pgtest.Pool(t, nil)
	_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(t, err)
	_, err = admin.Exec(ctx, "ALTER DATABASE "+pgx.Identifier{name}.Sanitize()+" SET default_transaction_isolation = 'serializable'")
	require.NoError(t, err)
	pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.Database = name
		cfg.MaxConns = 16
	})
	t.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(context.Background(), "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	var level string
	require.NoError(t, pool.QueryRow(ctx, "SHOW transaction_isolation").Scan(&level))
	require.Equal(t, "serializable", level)
	return ctx, pool, pgtest.Table(t, pool)
}

// TestSerializationRetry pins the statements' retry of serialization
// failures under default_transaction_isolation = serializable: none
// surfaces as an error, as contention or as a lost lease.
func TestSerializationRetry(t *testing.T) {
	t.Parallel()
	// Guarantee: with default_transaction_isolation = serializable on the database, claims
	// racing heartbeats and releases of the same rows make PostgreSQL raise
	// serialization failures (SQLSTATE 40001: "could not serialize access due to
	// concurrent update"). Each statement is a transaction of its own, so it is
	// retried; none may surface as an error, as contention or as a lost lease.
	t.Run("ReportsOnlyContention", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := serializableSetup(t)
		events := pgtest.NewEvents(t)

		// Holders of a few keys, heartbeating fast, while others claim the same
		// keys and claim and release keys of their own, all at once.
		const keys = 8
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(3*time.Second),
			pglease.WithHeartbeatInterval(20*time.Millisecond), pglease.WithHook(events.Hook))
		held := make([]*pglease.Lease, keys)
		for i := range held {
			var err error
			held[i], err = holder.Claim(ctx, fmt.Sprintf("held-%d", i))
			require.NoError(t, err)
		}
		var (
			wg     sync.WaitGroup
			claims claimTally
		)
		for i := range 6 {
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("c%d", i), pglease.WithTTL(3*time.Second),
				pglease.WithHeartbeatInterval(20*time.Millisecond), pglease.WithHook(events.Hook))
			wg.Go(func() {
				for n := range 150 {
					var key string
					switch n % 3 {
					case 0:
						key = fmt.Sprintf("held-%d", n%keys)
					case 1:
						key = "shared"
					default:
						key = fmt.Sprintf("own-%d", i)
					}
					claims.claim(ctx, l, key)
				}
			})
		}
		wg.Wait()
		claims.check(t)
		for _, e := range events.All() {
			if e.Err != nil && e.Kind != pglease.EventContended { // a failure the checks below count
				t.Logf("%s %q (holder %s, took %s): %v", e.Kind, e.Key, e.Holder, e.Took, e.Err)
			}
		}
		require.Zero(t, events.Count(pglease.EventLost), "leases lost")
		require.Zero(t, events.Count(pglease.EventHeartbeatFailed), "heartbeat rounds failed")
		require.Zero(t, events.Count(pglease.EventReleaseFailed), "releases failed")
		for _, ls := range held {
			require.NoError(t, ls.Err(), "%s", ls.Key())
		}
		t.Logf("figures: serializable: %d claims, %d contended, %d heartbeat rounds", claims.runs, events.Count(pglease.EventContended), events.Count(pglease.EventExtended))
	})

	// Guarantee: SKIP LOCKED and the snapshot read of the heartbeat behave the same in a
	// SERIALIZABLE transaction: one round extends every lease held.
	t.Run("HeartbeatRoundExtendsEveryLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := serializableSetup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(3*time.Second),
			pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook))
		const n = 50
		leases := make([]*pglease.Lease, n)
		for i := range leases {
			var err error
			leases[i], err = l.Claim(ctx, fmt.Sprintf("k%02d", i))
			require.NoError(t, err)
		}
		before := make([]time.Time, n)
		for i, ls := range leases {
			r, ok := pgtest.ReadRow(t, pool, table, ls.Key())
			require.True(t, ok)
			before[i] = r.ExpiresAt
		}
		// A round of all n that committed while the rows were being read
		// extended only those read before it: the next such round extends
		// every one past what was read.
		extendedAll := func() bool {
			for i, ls := range leases {
				r, ok := pgtest.ReadRow(t, pool, table, ls.Key())
				require.True(t, ok)
				require.Equal(t, ls.Fence(), r.Fence)
				if !r.ExpiresAt.After(before[i]) {
					return false
				}
			}
			return true
		}
		for rounds := 0; ; {
			ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second)
			if ev.Leases != n {
				continue
			}
			if extendedAll() {
				break
			}
			rounds++
			require.Less(t, rounds, 3, "no round of all %d leases extended every one", n)
		}
		for _, ls := range leases {
			require.NoError(t, ls.Err())
		}
	})
}
