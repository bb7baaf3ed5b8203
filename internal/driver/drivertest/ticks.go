package drivertest

import (
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

// tickOf is the schedule of a job of period p.
func tickOf(p time.Duration) driver.Ticks { return driver.Ticks{Period: p} }

// claimTick claims key's tick with p; the case fails on an error.
func (c *tc) claimTick(p driver.Protocol, key string, ttl time.Duration, tk driver.Ticks) driver.TickClaim {
	c.Helper()
	got, err := p.ClaimTick(c.ctx, c.db, key, ttl, 0, tk)
	require.NoError(c, err)
	require.False(c, got.Stale, "a stale claim")
	return got
}

// releaseRun releases the lease of a tick got took, closing its run with
// outcome.
func (c *tc) releaseRun(p driver.Protocol, key string, got driver.TickClaim, outcome string) {
	c.Helper()
	m := lease(key, got.Claimed, long)
	m.Run = outcome
	rel, err := p.ReleaseOne(c.ctx, c.db, m)
	require.NoError(c, err)
	require.Equal(c, map[int]bool{0: true}, rel)
}

var tickCases = []testCase{
	{"AClaimOfATickTakesItOnce", func(c *tc) {
		took := c.claimTick(c.a, "job", long, tickOf(day))
		require.True(c, took.Took)
		assert.True(c, took.Live)
		assert.True(c, took.IsRun)
		assert.Equal(c, "a", took.Holder)
		assert.Zero(c, took.Tick.UnixMicro()%day.Microseconds(), "the tick is a multiple of the period: %v", took.Tick)
		assert.WithinDuration(c, took.Tick, took.RowTick, 0)
		assert.LessOrEqual(c, took.AcquiredAt.Sub(took.Tick).Abs(), day/2, "the tick nearest the server's clock")

		other := c.claimTick(c.b, "job", long, tickOf(day))
		assert.False(c, other.Took, "a second holder, the same tick")
		assert.Equal(c, "a", other.Holder)
		assert.Equal(c, took.Fence, other.Fence)
		assert.True(c, other.Live)
		assert.False(c, other.Released)
		assert.WithinDuration(c, took.Tick, other.Tick, 0)
		assert.WithinDuration(c, took.Tick, other.RowTick, 0)

		c.releaseRun(c.a, "job", took, driver.RunCompleted)
		for _, p := range []driver.Protocol{c.a, c.b} {
			again := c.claimTick(p, "job", long, tickOf(day))
			assert.False(c, again.Took, "the same tick after its release")
			assert.True(c, again.Released)
			assert.False(c, again.Live)
			assert.Equal(c, took.Fence, again.Fence)
		}
		c.requireRow("job", "a", took.Fence, false)
	}},
	{"ALaterTickTakesTheRow", func(c *tc) {
		period := 2 * c.short
		first := c.claimTick(c.a, "job", c.short, tickOf(period))
		require.True(c, first.Took)
		assert.LessOrEqual(c, first.AcquiredAt.Sub(first.Tick).Abs(), period/2, "the tick nearest the server's clock, not the one before it")
		c.table.Advance(period)
		next := c.claimTick(c.b, "job", long, tickOf(period))
		require.True(c, next.Took)
		assert.LessOrEqual(c, next.AcquiredAt.Sub(next.Tick).Abs(), period/2)
		assert.GreaterOrEqual(c, next.Tick.Sub(first.Tick), period)
		assert.Greater(c, next.Fence, first.Fence)
		c.requireRow("job", "b", next.Fence, true)
	}},
	{"ATickWhoseClaimWasGivenBackIsTakenAgain", func(c *tc) {
		first := c.claimTick(c.a, "job", long, tickOf(day))
		require.True(c, first.Took)
		c.releaseRun(c.a, "job", first, driver.RunGivenBack)
		c.requireRow("job", "a", first.Fence, false)
		again := c.claimTick(c.b, "job", long, tickOf(day))
		require.True(c, again.Took, "a tick given back ran nothing")
		assert.WithinDuration(c, first.Tick, again.Tick, 0)
		assert.Greater(c, again.Fence, first.Fence)
	}},
	{"ACatchUpTakesTheTickOfARunThatLapsedOnly", func(c *tc) {
		lapsed := c.claimTick(c.a, "lapsed", c.short, tickOf(day))
		done := c.claimTick(c.a, "done", long, tickOf(day))
		require.True(c, lapsed.Took)
		require.True(c, done.Took)
		c.releaseRun(c.a, "done", done, driver.RunCompleted)
		c.table.Advance(c.short)

		plain := c.claimTick(c.b, "lapsed", long, tickOf(day))
		assert.False(c, plain.Took, "no claim but a catch-up runs a tick again")
		assert.False(c, plain.Released)
		assert.True(c, plain.IsRun)
		assert.False(c, plain.Live)

		catchUp := driver.Ticks{Period: day, CatchUp: lapsed.Tick}
		caught := c.claimTick(c.b, "lapsed", long, catchUp)
		require.True(c, caught.Took)
		assert.WithinDuration(c, lapsed.Tick, caught.Tick, 0)
		assert.Greater(c, caught.Fence, lapsed.Fence)
		c.requireRow("lapsed", "b", caught.Fence, true)

		catchUp.CatchUp = done.Tick
		refused := c.claimTick(c.b, "done", long, catchUp)
		assert.False(c, refused.Took, "a run released completed is not caught up")
		assert.True(c, refused.Released)
	}},
	{"AClaimOutsideTheInstantsSentIsStale", func(c *tc) {
		tk := driver.Ticks{Instants: []time.Time{time.Unix(60, 0), time.Unix(120, 0)}}
		got, err := c.a.ClaimTick(c.ctx, c.db, "job", long, 0, tk)
		require.NoError(c, err)
		assert.True(c, got.Stale)
		assert.False(c, got.Took)
		_, ok := c.table.Row("job")
		assert.False(c, ok, "a stale claim writes nothing")
	}},
	{"AClaimOfInstantsTakesTheOneNearestTheServersClock", func(c *tc) {
		// The server's clock lies between these, nearer the first.
		tk := driver.Ticks{Instants: []time.Time{time.Unix(60, 0), time.Unix(120, 0), time.Date(3000, 1, 1, 0, 0, 0, 0, time.UTC)}}
		got := c.claimTick(c.a, "job", long, tk)
		require.True(c, got.Took)
		assert.WithinDuration(c, time.Unix(120, 0), got.Tick, 0)
	}},
}
