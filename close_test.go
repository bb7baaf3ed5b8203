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
