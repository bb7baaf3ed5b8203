package pglease_test

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestLeases pins Locker.Leases: a sorted copy of what is held, with the
// server's times, the trust deadline and what the last round found.
func TestLeases(t *testing.T) {
	t.Parallel()
	// Guarantee: Leases is a copy of the held leases sorted by key, with their
	// server times and trust deadline.
	t.Run("SortedCopyWithServerTimes", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(10*time.Second))
		assert.Empty(t, l.Leases())

		byKey := map[string]*pglease.Lease{}
		for _, key := range []string{"c", "a", "b"} {
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			byKey[key] = lease
		}
		require.NoError(t, byKey["c"].Unlock(ctx))

		got := l.Leases()
		require.Len(t, got, 2, "a released lease is not listed")
		assert.Equal(t, "a", got[0].Key)
		assert.Equal(t, "b", got[1].Key)
		for _, info := range got {
			lease := byKey[info.Key]
			assert.Equal(t, lease.Holder(), info.Holder)
			assert.Equal(t, lease.Fence(), info.Fence)
			assert.True(t, lease.AcquiredAt().Equal(info.AcquiredAt))
			assert.True(t, lease.ExpiresAt().Equal(info.ExpiresAt))
			assert.Equal(t, pglease.LeaseConfirmed, info.State)
			left := time.Until(info.TrustUntil)
			assert.Positive(t, left)
			assert.Less(t, left, l.TTL(), "trusted for less than the TTL from now")
		}
		got[0].Key = "changed"
		assert.Equal(t, "a", l.Leases()[0].Key, "a copy")

		// Safe for concurrent use (the race detector watches).
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k%d", i)
				lease, err := l.Claim(ctx, key)
				if assert.NoError(t, err) {
					_ = l.Leases()
					assert.NoError(t, lease.Unlock(ctx))
				}
			}()
			_ = l.Leases()
		}
		wg.Wait()
		assert.Len(t, l.Leases(), 2)
	})

	// Guarantee: Leases says when a heartbeat round found the row locked or
	// failed.
	t.Run("SaysWhenARoundFoundTheRowLockedOrFailed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		faulty := pgtest.NewFaultyDB(pool)
		l := pgtest.Locker(t, faulty, table, "replica-a", pglease.WithTTL(5*time.Second),
			pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
		_, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		tx := pgtest.LockRows(t, pool, table, `key = 'k'`)
		require.Eventually(t, func() bool {
			got := l.Leases()
			return len(got) == 1 && got[0].State == pglease.LeaseRowLocked
		}, 5*time.Second, 10*time.Millisecond, "a round skips the locked row")
		require.NoError(t, tx.Rollback(ctx))
		require.Eventually(t, func() bool {
			got := l.Leases()
			return len(got) == 1 && got[0].State == pglease.LeaseConfirmed
		}, 5*time.Second, 10*time.Millisecond, "the next round extends it again")

		faulty.SetFail("heartbeat", errors.New("injected: connection reset"))
		events.WaitFor(t, pglease.EventHeartbeatFailed, 5*time.Second)
		got := l.Leases()
		require.Len(t, got, 1)
		assert.Equal(t, pglease.LeaseRetrying, got[0].State)
		faulty.SetFail("heartbeat", nil)
	})
}
