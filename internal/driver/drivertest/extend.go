package drivertest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

var extendCases = []testCase{
	{"ExtendExtendsOnlyALeaseWhoseFenceStillMatches", func(c *tc) {
		lapsed := c.claim(c.a, "lapsed", c.short)
		kept := c.claim(c.a, "kept", long)
		old := c.claim(c.a, "reclaimed", long)
		reclaimed := c.claim(c.a, "reclaimed", long)
		c.table.Advance(c.short)

		ms := []driver.Lease{lease("kept", kept, long), lease("reclaimed", old, long), lease("lapsed", lapsed, long)}
		got, err := c.a.Extend(c.ctx, c.db, ms)
		require.NoError(c, err)
		require.Contains(c, got, 0)
		assert.NotContains(c, got, 1, "the old fence of a re-claimed row is lost")
		assert.NotContains(c, got, 2, "a lapsed lease is lost")
		ext := got[0]
		assert.False(c, ext.Locked)
		assert.True(c, ext.ExpiresAt.After(kept.ExpiresAt), "extended past its expiry: %v, was %v", ext.ExpiresAt, kept.ExpiresAt)
		assert.WithinDuration(c, ext.ServerNow.Add(long), ext.ExpiresAt, time.Second, "new expiry = the server's clock + TTL")

		c.requireRow("kept", "a", kept.Fence, true)
		c.requireRow("reclaimed", "a", reclaimed.Fence, true)
		c.requireRow("lapsed", "a", lapsed.Fence, false) // not revived

		// Another holder's heartbeat with the right key and fence matches
		// nothing: the holder is part of the match.
		other, err := c.b.Extend(c.ctx, c.db, []driver.Lease{lease("kept", kept, long)})
		require.NoError(c, err)
		assert.Empty(c, other)
	}},
	{"ExtendGivesEachLeaseItsOwnTTL", func(c *tc) {
		one := c.claim(c.a, "one", c.short)
		two := c.claim(c.a, "two", c.short)
		got, err := c.a.Extend(c.ctx, c.db, []driver.Lease{lease("one", one, long), lease("two", two, 2*c.short)})
		require.NoError(c, err)
		require.Len(c, got, 2)
		assert.WithinDuration(c, got[0].ServerNow.Add(long), got[0].ExpiresAt, time.Second)
		assert.WithinDuration(c, got[1].ServerNow.Add(2*c.short), got[1].ExpiresAt, c.short/2)
		c.table.Advance(2 * c.short)
		c.requireRow("one", "a", one.Fence, true)
		c.requireRow("two", "a", two.Fence, false)
	}},
}
