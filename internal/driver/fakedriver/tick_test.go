package fakedriver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

func TestNearestTick(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		require.NoError(t, err)
		return tm
	}
	instants := []time.Time{at("2026-01-01T10:00:00Z"), at("2026-01-01T11:00:00Z"), at("2026-01-01T12:00:00Z")}
	cases := []struct {
		name string
		tk   driver.Ticks
		now  string
		want string // "" : stale
	}{
		{"APeriodRoundsDown", driver.Ticks{Period: time.Minute}, "2026-01-01T10:00:29.999999Z", "2026-01-01T10:00:00Z"},
		{"APeriodRoundsAHalfUp", driver.Ticks{Period: time.Minute}, "2026-01-01T10:00:30Z", "2026-01-01T10:01:00Z"},
		{"InstantsNearest", driver.Ticks{Instants: instants}, "2026-01-01T10:20:00Z", "2026-01-01T10:00:00Z"},
		{"InstantsATieToTheLater", driver.Ticks{Instants: instants}, "2026-01-01T11:30:00Z", "2026-01-01T12:00:00Z"},
		{"InstantsAtTheirEdge", driver.Ticks{Instants: instants}, "2026-01-01T12:00:00Z", "2026-01-01T12:00:00Z"},
		{"InstantsBeforeTheFirstAreStale", driver.Ticks{Instants: instants}, "2026-01-01T09:59:59.999999Z", ""},
		{"InstantsAfterTheLastAreStale", driver.Ticks{Instants: instants}, "2026-01-01T12:00:00.000001Z", ""},
		{"NoScheduleIsStale", driver.Ticks{}, "2026-01-01T12:00:00Z", ""},
		{"APeriodWinsOverInstants", driver.Ticks{Period: time.Hour, Instants: instants}, "2026-01-01T09:00:00Z", "2026-01-01T09:00:00Z"},
		{"ACatchUpWinsOverAll", driver.Ticks{Period: time.Hour, CatchUp: at("2025-12-31T00:00:00Z")}, "2026-01-01T09:00:00Z", "2025-12-31T00:00:00Z"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			tick, ok, err := nearestTick(tc.tk, at(tc.now))
			require.NoError(t, err)
			if tc.want == "" {
				assert.False(t, ok)
				return
			}
			require.True(t, ok)
			assert.Equal(t, at(tc.want), tick)
		})
	}
	t.Run("APeriodBelowAMicrosecondDividesByZero", func(t *testing.T) {
		t.Parallel()
		_, _, err := nearestTick(driver.Ticks{Period: time.Nanosecond}, at("2026-01-01T09:00:00Z"))
		assert.True(t, driver.Is(err, driver.DivisionByZero), "%v", err)
	})
}

func TestClaimTick(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("ARunOfAnEarlierTickStillLiveHoldsTheKey", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a, b := tbl.Protocol("a"), tbl.Protocol("b")
		tk := driver.Ticks{Period: time.Minute}
		first, err := a.ClaimTick(ctx, nil, "job", time.Hour, 0, tk)
		require.NoError(t, err)
		require.True(t, first.Took)
		tbl.Advance(time.Minute)
		got, err := b.ClaimTick(ctx, nil, "job", time.Hour, 0, tk)
		require.NoError(t, err)
		assert.False(t, got.Took)
		assert.Equal(t, first.Tick.Add(time.Minute), got.Tick)
		assert.Equal(t, first.Tick, got.RowTick)
		assert.True(t, got.Live)
		assert.True(t, got.IsRun)

		// Its own holder takes the next tick of its live row.
		own, err := a.ClaimTick(ctx, nil, "job", time.Hour, 0, tk)
		require.NoError(t, err)
		assert.True(t, own.Took)
		assert.Greater(t, own.Fence, first.Fence)
	})
	t.Run("APlainClaimsRowIsNoRunOfItsTick", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a, b := tbl.Protocol("a"), tbl.Protocol("b")
		tk := driver.Ticks{Period: time.Hour}
		took, err := a.ClaimTick(ctx, nil, "job", time.Minute, 0, tk)
		require.NoError(t, err)
		c, ok, err := a.Claim(ctx, nil, "job", time.Minute, 0)
		require.NoError(t, err)
		require.True(t, ok)
		tbl.Advance(time.Minute)
		got, err := b.ClaimTick(ctx, nil, "job", time.Minute, 0, driver.Ticks{Period: time.Hour, CatchUp: took.Tick})
		require.NoError(t, err)
		assert.False(t, got.Took, "the lapse of a plain claim is not the lapse of the tick's run")
		assert.False(t, got.IsRun)
		assert.Equal(t, c.Fence, got.Fence)
	})
	t.Run("AStaleClaimSaysSo", func(t *testing.T) {
		t.Parallel()
		got, err := NewTable().Protocol("a").ClaimTick(ctx, nil, "job", time.Minute, 0, driver.Ticks{Instants: []time.Time{Start.Add(time.Hour)}})
		require.NoError(t, err)
		assert.True(t, got.Stale)
		assert.False(t, got.Took)
		assert.Zero(t, got.Tick.Unix())
	})
}
