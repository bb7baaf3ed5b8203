package pglease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: under a generic plan (plan_cache_mode = force_generic_plan, as
// a server or role may set, and as PostgreSQL chooses by itself after five
// executions of a prepared statement), the heartbeat tells locked rows from
// lost ones whatever the number of locked rows: none, one, all. A locked
// lease is skipped, never lost, until its own trust deadline, and extended
// again once the lock is gone.
func TestHeartbeatUnderAGenericPlanSkipsLockedRowsWhateverTheirNumber(t *testing.T) {
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
			ends = append(ends, lockRow(t, direct, table, k))
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
}
