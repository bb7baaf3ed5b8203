package drivertest

import (
	"fmt"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

var claimCases = []testCase{
	{"AFreeKeyIsClaimed", func(c *tc) {
		got := c.claim(c.a, "k", long)
		assert.Equal(c, "a", got.Holder)
		assert.Positive(c, got.Fence)
		assert.Equal(c, long, got.ExpiresAt.Sub(got.AcquiredAt), "expiry = acquired + TTL, from one clock reading")
		c.requireRow("k", "a", got.Fence, true)

		// With a lock wait, the real driver sends it as a burst of one.
		waited, ok, err := c.a.Claim(c.ctx, c.db, "w", long, 50*time.Millisecond)
		require.NoError(c, err)
		require.True(c, ok)
		assert.Greater(c, waited.Fence, got.Fence)
		c.requireRow("w", "a", waited.Fence, true)
	}},
	{"EachClaimExpiresAfterItsOwnTTL", func(c *tc) {
		// The protocol's own TTL and another, in turn: each claim's expiry
		// is its own TTL after its acquisition.
		for i, ttl := range []time.Duration{long, c.short, long, c.short} {
			got := c.claim(c.a, fmt.Sprintf("k%d", i), ttl)
			assert.Equal(c, ttl, got.ExpiresAt.Sub(got.AcquiredAt), "claim %d", i)
		}
	}},
	{"ALiveRowOfAnotherHolderRefusesAndIsUnchanged", func(c *tc) {
		got := c.claim(c.a, "k", long)
		c.refused(c.b, "k")
		_, ok, err := c.b.Claim(c.ctx, c.db, "k", long, 50*time.Millisecond)
		require.NoError(c, err)
		assert.False(c, ok, "refused with a lock wait too")
		c.requireRow("k", "a", got.Fence, true)
	}},
	{"TheSameHoldersClaimIsReentrantAndItsFenceGrows", func(c *tc) {
		first := c.claim(c.a, "k", long)
		again := c.claim(c.a, "k", c.short)
		assert.Greater(c, again.Fence, first.Fence)
		assert.WithinDuration(c, first.ExpiresAt, again.ExpiresAt, 0, "a re-entrant claim with a shorter TTL never moves the expiry back")
		c.requireRow("k", "a", again.Fence, true)
	}},
	{"FencesOnlyGrowAcrossKeysAndReclaims", func(c *tc) {
		var fences []int64
		fences = append(fences, c.claim(c.a, "k1", c.short).Fence)
		fences = append(fences, c.claim(c.a, "k2", long).Fence)
		fences = append(fences, c.claim(c.a, "k1", c.short).Fence)
		burst, err := c.b.ClaimAll(c.ctx, c.db, []string{"k4", "k3"}, []float64{long.Seconds(), long.Seconds()}, time.Second)
		require.NoError(c, err)
		require.Len(c, burst, 2)
		fences = append(fences, burst["k3"].Fence, burst["k4"].Fence) // drawn in the keys' byte order
		c.table.Advance(c.short)
		fences = append(fences, c.claim(c.b, "k1", long).Fence)
		tick, err := c.a.ClaimTick(c.ctx, c.db, "k5", long, 0, tickOf(day))
		require.NoError(c, err)
		require.True(c, tick.Took)
		fences = append(fences, tick.Fence)
		for i := 1; i < len(fences); i++ {
			assert.Greater(c, fences[i], fences[i-1], "fences in the order drawn: %v", fences)
		}
	}},
	{"AnExpiredRowIsClaimedByAnotherHolderWithAGreaterFence", func(c *tc) {
		first := c.claim(c.a, "k", c.short)
		c.table.Advance(c.short)
		c.requireRow("k", "a", first.Fence, false)
		next := c.claim(c.b, "k", long)
		assert.Equal(c, "b", next.Holder)
		assert.Greater(c, next.Fence, first.Fence)
		c.requireRow("k", "b", next.Fence, true)
	}},
	{"ClaimAllTakesTheFreeKeysAndLeavesTheHeldOnesOut", func(c *tc) {
		require.True(c, c.a.Bursts())
		held := c.claim(c.b, "held", long)
		lapsed := c.claim(c.b, "lapsed", c.short)
		own := c.claim(c.a, "own", long)
		c.table.Advance(c.short)
		keys := []string{"free", "held", "lapsed", "own"}
		ttls := []float64{long.Seconds(), long.Seconds(), long.Seconds(), long.Seconds()}
		got, err := c.a.ClaimAll(c.ctx, c.db, keys, ttls, time.Second)
		require.NoError(c, err)
		require.ElementsMatch(c, []string{"free", "lapsed", "own"}, keysOf(got))
		for key, cl := range got {
			assert.Equal(c, "a", cl.Holder, key)
			assert.True(c, cl.Live, key)
			assert.Greater(c, cl.Fence, own.Fence, key)
			c.requireRow(key, "a", cl.Fence, true)
		}
		assert.Greater(c, got["lapsed"].Fence, lapsed.Fence)
		c.requireRow("held", "b", held.Fence, true)
	}},
	{"AClaimThatWouldBreakTheCheckFailsWhole", func(c *tc) {
		_, ok, err := c.a.Claim(c.ctx, c.db, "k", 0, 0)
		assert.False(c, ok)
		assert.True(c, driver.Is(err, "23514"), "CHECK (expires_at > acquired_at): %v", err)
		_, err = c.a.ClaimAll(c.ctx, c.db, []string{"x", "y"}, []float64{long.Seconds(), 0}, time.Second)
		assert.True(c, driver.Is(err, "23514"), "%v", err)
		for _, key := range []string{"k", "x", "y"} {
			_, exists := c.table.Row(key)
			assert.False(c, exists, "%s written by a statement that failed", key)
		}
	}},
}

func keysOf[V any](m map[string]V) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	return out
}
