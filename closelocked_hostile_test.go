package pglease_test

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: Close returns within its timeout even when many rows are
// locked by another transaction, and every lease gets exactly one outcome
// event (EventReleased or EventReleaseFailed), also when Unlock races with
// Close on the same leases.
func TestCloseWithManyLockedRowsEndsWithinItsTimeoutAndReportsEachLeaseOnce(t *testing.T) {
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
}
