package drivertest

import (
	"context"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

var lockCases = []testCase{
	{"AHeartbeatSkipsALockedRowAndSaysSo", func(c *tc) {
		locked := c.claim(c.a, "locked", long)
		free := c.claim(c.a, "free", long)
		unlock := c.table.LockRow("locked")
		ms := []driver.Lease{lease("locked", locked, long), lease("free", free, long)}
		got, err := c.a.Extend(c.ctx, c.db, ms)
		require.NoError(c, err)
		require.Contains(c, got, 0, "a locked row is not a lost lease")
		assert.True(c, got[0].Locked)
		assert.True(c, got[0].ExpiresAt.IsZero(), "not extended")
		require.Contains(c, got, 1)
		assert.False(c, got[1].Locked, "the other leases of the round are extended")

		unlock()
		got, err = c.a.Extend(c.ctx, c.db, ms)
		require.NoError(c, err)
		require.Contains(c, got, 0)
		assert.False(c, got[0].Locked)
	}},
	{"AReleaseSkipsALockedRowToBeSentAgain", func(c *tc) {
		got := c.claim(c.a, "k", long)
		unlock := c.table.LockRow("k")
		rel, err := c.a.Release(c.ctx, c.db, []driver.Lease{lease("k", got, long)})
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: false}, rel)
		rel, err = c.a.ReleaseOne(c.ctx, c.db, lease("k", got, long))
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: false}, rel)
		c.requireRow("k", "a", got.Fence, true)

		unlock()
		rel, err = c.a.ReleaseOne(c.ctx, c.db, lease("k", got, long))
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: true}, rel)
		c.requireRow("k", "a", got.Fence, false)
	}},
	{"AClaimRefusedByALockedRowIsRefusedAtOnce", func(c *tc) {
		held := c.claim(c.b, "k", long)
		defer c.table.LockRow("k")()
		ctx, cancel := context.WithTimeout(c.ctx, 5*time.Second)
		defer cancel()
		_, ok, err := c.a.Claim(ctx, c.db, "k", long, 0)
		require.NoError(c, err, "having only read the row, it does not wait for its lock")
		assert.False(c, ok)
		tick, err := c.a.ClaimTick(ctx, c.db, "k", long, 0, tickOf(day))
		require.NoError(c, err)
		assert.False(c, tick.Took)
		assert.Equal(c, held.Fence, tick.Fence)
	}},
	{"AClaimOfALockedRowItWouldTakeFailsWhenItsLockWaitPasses", func(c *tc) {
		lapsed := c.claim(c.a, "k", c.short)
		c.table.Advance(c.short)
		unlock := c.table.LockRow("k")
		_, ok, err := c.b.Claim(c.ctx, c.db, "k", long, 20*time.Millisecond)
		assert.False(c, ok)
		assert.True(c, driver.Is(err, driver.LockNotAvailable), "lock_not_available: %v", err)
		_, err = c.b.ClaimAll(c.ctx, c.db, []string{"k", "other"}, []float64{long.Seconds(), long.Seconds()}, 20*time.Millisecond)
		assert.True(c, driver.Is(err, driver.LockNotAvailable), "the whole burst: %v", err)
		_, ok = c.table.Row("other")
		assert.False(c, ok, "a burst that failed wrote nothing")
		_, err = c.b.ClaimTick(c.ctx, c.db, "k", long, 20*time.Millisecond, tickOf(day))
		assert.True(c, driver.Is(err, driver.LockNotAvailable), "%v", err)
		c.requireRow("k", "a", lapsed.Fence, false)

		unlock()
		next := c.claim(c.b, "k", long)
		assert.Greater(c, next.Fence, lapsed.Fence)
	}},
}
