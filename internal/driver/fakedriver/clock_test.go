package fakedriver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestClock(t *testing.T) {
	t.Parallel()

	t.Run("MovesOnlyWhenAdvancedAndByAMicrosecondPerStatement", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		assert.Equal(t, Start, tbl.Now())
		assert.Equal(t, Start, tbl.Now(), "reading the clock does not move it")
		tbl.Advance(time.Second)
		assert.Equal(t, Start.Add(time.Second), tbl.Now())
		_, err := tbl.Protocol("a").ReadRow(context.Background(), nil, "k", time.Second)
		require.NoError(t, err)
		assert.Equal(t, Start.Add(time.Second+time.Microsecond), tbl.Now())
	})
	t.Run("StepsBack", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		tbl.Advance(-time.Hour)
		assert.Equal(t, Start.Add(-time.Hour), tbl.Now())
	})
	t.Run("ReadsWholeMicroseconds", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		tbl.Advance(999 * time.Nanosecond)
		assert.Equal(t, Start, tbl.Now())
		tbl.Advance(time.Nanosecond)
		assert.Equal(t, Start.Add(time.Microsecond), tbl.Now())
	})
	t.Run("AReleaseRightAfterItsClaimEndsTheLease", func(t *testing.T) {
		// Without the step, the release would keep the row a microsecond
		// past its acquired time on a clock that never moved past it.
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, ok, err := a.Claim(context.Background(), nil, "k", time.Minute, 0)
		require.NoError(t, err)
		require.True(t, ok)
		got, err := a.ReleaseOne(context.Background(), nil, leaseOf("k", c))
		require.NoError(t, err)
		require.Equal(t, map[int]bool{0: true}, got)
		r, _ := tbl.Row("k")
		assert.False(t, r.Live)
	})
}
