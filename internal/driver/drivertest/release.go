package drivertest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

var releaseCases = []testCase{
	{"ReleaseExpiresTheRowInPlace", func(c *tc) {
		one := c.claim(c.a, "one", long)
		batch := []driver.Claimed{c.claim(c.a, "b1", long), c.claim(c.a, "b2", long)}

		got, err := c.a.ReleaseOne(c.ctx, c.db, lease("one", one, long))
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: true}, got)
		c.requireRow("one", "a", one.Fence, false)

		got, err = c.a.Release(c.ctx, c.db, []driver.Lease{lease("b1", batch[0], long), lease("b2", batch[1], long)})
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: true, 1: true}, got)
		c.requireRow("b1", "a", batch[0].Fence, false)
		c.requireRow("b2", "a", batch[1].Fence, false)

		// Released means free: another holder takes it at once.
		next := c.claim(c.b, "one", long)
		assert.Greater(c, next.Fence, batch[1].Fence)
	}},
	{"ReleaseHonoursTheMinHold", func(c *tc) {
		one := c.claim(c.a, "one", long)
		batched := c.claim(c.a, "batched", long)
		m := lease("one", one, long)
		m.MinHold = c.short
		got, err := c.a.ReleaseOne(c.ctx, c.db, m)
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: true}, got)
		m = lease("batched", batched, long)
		m.MinHold = c.short
		got, err = c.a.Release(c.ctx, c.db, []driver.Lease{m})
		require.NoError(c, err)
		assert.Equal(c, map[int]bool{0: true}, got)

		// Live until acquired + min hold, and so refused to another holder.
		c.requireRow("one", "a", one.Fence, true)
		c.requireRow("batched", "a", batched.Fence, true)
		c.refused(c.b, "one")
		c.refused(c.b, "batched")

		c.table.Advance(c.short)
		c.requireRow("one", "a", one.Fence, false)
		c.requireRow("batched", "a", batched.Fence, false)
		c.claim(c.b, "one", long)
	}},
	{"AStaleReleaseReportsNothingAndLeavesTheNewLeaseLive", func(c *tc) {
		old := c.claim(c.a, "mine", long)
		reclaimed := c.claim(c.a, "mine", long)
		got, err := c.a.ReleaseOne(c.ctx, c.db, lease("mine", old, long))
		require.NoError(c, err)
		assert.Empty(c, got)
		got, err = c.a.Release(c.ctx, c.db, []driver.Lease{lease("mine", old, long)})
		require.NoError(c, err)
		assert.Empty(c, got)
		c.requireRow("mine", "a", reclaimed.Fence, true)

		lapsed := c.claim(c.a, "taken", c.short)
		c.table.Advance(c.short)
		taken := c.claim(c.b, "taken", long)
		got, err = c.a.ReleaseOne(c.ctx, c.db, lease("taken", lapsed, long))
		require.NoError(c, err)
		assert.Empty(c, got)
		c.requireRow("taken", "b", taken.Fence, true)

		// A lease released once is not released again.
		got, err = c.a.ReleaseOne(c.ctx, c.db, lease("mine", reclaimed, long))
		require.NoError(c, err)
		require.Equal(c, map[int]bool{0: true}, got)
		got, err = c.a.ReleaseOne(c.ctx, c.db, lease("mine", reclaimed, long))
		require.NoError(c, err)
		assert.Empty(c, got)
	}},
	{"AHeartbeatWithinTheMinHoldOfAReleaseExtendsItAgain", func(c *tc) {
		// The hazard the Locker orders its heartbeat rounds against its
		// releases for: a released row still in its min hold still
		// matches the heartbeat's guard.
		got := c.claim(c.a, "k", long)
		m := lease("k", got, long)
		m.MinHold = c.short
		rel, err := c.a.ReleaseOne(c.ctx, c.db, m)
		require.NoError(c, err)
		require.Equal(c, map[int]bool{0: true}, rel)
		ext, err := c.a.Extend(c.ctx, c.db, []driver.Lease{m})
		require.NoError(c, err)
		require.Contains(c, ext, 0)
		c.table.Advance(c.short)
		c.requireRow("k", "a", got.Fence, true)
	}},
}

var readCases = []testCase{
	{"ReadRowReportsTheLeaseARowCarries", func(c *tc) {
		none, err := c.a.ReadRow(c.ctx, c.db, "k", time.Second)
		require.NoError(c, err)
		assert.Equal(c, driver.RowLease{}, none, "no row, no lease")

		got := c.claim(c.a, "k", long)
		for _, p := range []driver.Protocol{c.a, c.b} {
			read, err := p.ReadRow(c.ctx, c.db, "k", time.Second)
			require.NoError(c, err)
			assert.Equal(c, driver.RowLease{Holder: "a", Fence: got.Fence, Live: true}, read)
		}

		_, err = c.a.ReleaseOne(c.ctx, c.db, lease("k", got, long))
		require.NoError(c, err)
		read, err := c.b.ReadRow(c.ctx, c.db, "k", time.Second)
		require.NoError(c, err)
		assert.Equal(c, driver.RowLease{Holder: "a", Fence: got.Fence, Live: false}, read)
	}},
}
