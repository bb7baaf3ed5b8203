package listen

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestRedial(t *testing.T) {
	t.Parallel()
	ms := time.Millisecond

	t.Run("DoublesUpToItsCap", func(t *testing.T) {
		t.Parallel()
		var r Redial
		var got []time.Duration
		for range 11 {
			got = append(got, r.Failed(0, false))
		}
		require.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms, 3200 * ms, 6400 * ms,
			12800 * ms, 25600 * ms, 30 * time.Second, 30 * time.Second}, got)
	})

	t.Run("KeepsGrowingWhileConnectionsDieSoonAfterReady", func(t *testing.T) {
		t.Parallel()
		var r Redial
		var got []time.Duration
		for range 5 {
			got = append(got, r.Failed(200*ms, false))
		}
		require.Equal(t, []time.Duration{100 * ms, 200 * ms, 400 * ms, 800 * ms, 1600 * ms}, got)
	})

	t.Run("StartsOverAfterAStableConnection", func(t *testing.T) {
		t.Parallel()
		var r Redial
		for range 5 {
			r.Failed(0, false)
		}
		require.Equal(t, 100*ms, r.Failed(stableListen, false))
		require.Equal(t, 200*ms, r.Failed(0, false))
	})

	t.Run("TriesALostProbeAgainWithItsOwnBackoff", func(t *testing.T) {
		t.Parallel()
		var r Redial
		require.Equal(t, 100*ms, r.Failed(0, false))
		var got []time.Duration
		for range 8 {
			got = append(got, r.Failed(0, true))
		}
		require.Equal(t, []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second,
			80 * time.Second, 160 * time.Second, 5 * time.Minute, 5 * time.Minute}, got)
		require.Equal(t, 200*ms, r.Failed(0, false), "the failure pauses go on where they were")
		r.Delivered()
		require.Equal(t, 5*time.Second, r.Failed(0, true), "a probe that came back starts the lost ones over")
	})
}
