package poll_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/poll"
)

func schedule(jitter func(time.Duration) time.Duration) *poll.Schedule {
	return &poll.Schedule{Min: 10 * time.Millisecond, Max: time.Second, Notified: 5 * time.Second, Margin: time.Millisecond, Jitter: jitter}
}

func none(time.Duration) time.Duration   { return 0 }
func full(d time.Duration) time.Duration { return d }

func TestSchedule(t *testing.T) {
	t.Parallel()

	t.Run("DoublesUpToMaxWhilePolling", func(t *testing.T) {
		t.Parallel()
		s := schedule(none)
		var got []time.Duration
		for range 10 {
			got = append(got, s.Pause(false, poll.Unknown, 0))
		}
		ms := time.Millisecond
		require.Equal(t, []time.Duration{10 * ms, 20 * ms, 40 * ms, 80 * ms, 160 * ms, 320 * ms, 640 * ms, time.Second, time.Second, time.Second}, got)
	})

	t.Run("TriesAtMostOncePerMaxOnceThere", func(t *testing.T) {
		t.Parallel()
		for _, j := range []func(time.Duration) time.Duration{none, full, func(d time.Duration) time.Duration { return d / 3 }} {
			s := schedule(j)
			var total time.Duration
			attempts := 0
			for total < time.Minute {
				p := s.Pause(false, poll.Live, time.Hour)
				require.LessOrEqual(t, p, time.Second*5/4, "the jitter lengthens a pause by a quarter at most")
				total += p
				attempts++
			}
			// 7 steps below Max (1.27s in all), then one per second at most.
			require.LessOrEqual(t, attempts, 7+60)
			require.GreaterOrEqual(t, attempts, 7+47)
		}
	})

	t.Run("JitterNeverShortensAPollingStep", func(t *testing.T) {
		t.Parallel()
		s := schedule(func(d time.Duration) time.Duration { return -d }) // out of range: clamped
		for range 20 {
			s.Pause(false, poll.Unknown, 0)
		}
		require.Equal(t, time.Second, s.Pause(false, poll.Unknown, 0))
		s = schedule(func(d time.Duration) time.Duration { return 10 * d })
		for range 20 {
			s.Pause(false, poll.Unknown, 0)
		}
		require.Equal(t, time.Second*5/4, s.Pause(false, poll.Unknown, 0))
	})

	t.Run("WakesAtTheHoldersExpiry", func(t *testing.T) {
		t.Parallel()
		grown := func() *poll.Schedule {
			s := schedule(none)
			for range 20 {
				s.Pause(false, poll.Unknown, 0)
			}
			return s
		}
		require.Equal(t, 301*time.Millisecond, grown().Pause(false, poll.Live, 300*time.Millisecond))
		require.Equal(t, time.Second, grown().Pause(false, poll.Live, time.Hour))
		require.Equal(t, time.Duration(0), grown().Pause(false, poll.Live, -time.Second), "lapsed already")
		require.Equal(t, time.Duration(0), grown().Pause(false, poll.Missing, time.Hour))
		require.Equal(t, 2*time.Second+time.Millisecond, grown().Pause(true, poll.Live, 2*time.Second))
	})

	t.Run("TriesAgainAtAnExpiryReachedEarly", func(t *testing.T) {
		t.Parallel()
		s := schedule(none)
		for range 20 {
			s.Pause(false, poll.Unknown, 0)
		}
		require.Equal(t, 301*time.Millisecond, s.Pause(false, poll.Live, 300*time.Millisecond))
		// The attempt came a little before the server's expiry: the same
		// lease, about to lapse.
		require.Equal(t, 3*time.Millisecond, s.Pause(false, poll.Live, 2*time.Millisecond))
		require.Equal(t, time.Duration(0), s.Pause(false, poll.Live, -time.Millisecond))
	})

	t.Run("KeepsTheCeilingBehindAHeartbeat", func(t *testing.T) {
		t.Parallel()
		// A 300ms lease extended every 100ms: whenever the waiter reads it,
		// it has 200 to 300ms left.
		for _, notified := range []bool{false, true} {
			s := schedule(none)
			var total time.Duration
			attempts := 0
			for total < time.Minute {
				left := 200*time.Millisecond + total%(100*time.Millisecond)
				p := s.Pause(notified, poll.Live, left)
				total += p
				attempts++
			}
			if notified {
				require.LessOrEqual(t, attempts, 2+60, "notified: at most one attempt per Max")
				continue
			}
			// The steps below Max, one attempt at the first expiry, then
			// one per second at most.
			require.LessOrEqual(t, attempts, 7+1+60, "polling: at most one attempt per Max")
			require.GreaterOrEqual(t, attempts, 55)
		}
	})

	t.Run("SeesALapseWithinAStepOnceBeaten", func(t *testing.T) {
		t.Parallel()
		s := schedule(none)
		for range 20 {
			s.Pause(false, poll.Unknown, 0)
		}
		s.Pause(false, poll.Live, 300*time.Millisecond)
		require.Equal(t, time.Second, s.Pause(false, poll.Live, 250*time.Millisecond), "extended: no hurry")
		require.Equal(t, time.Second, s.Pause(false, poll.Live, -time.Millisecond), "lapsed since: at the next step")
		require.Equal(t, time.Duration(0), s.Pause(false, poll.Missing, 0), "a missing row at once")
	})

	t.Run("RepollTurnsANotifiedPauseIntoAPollingOne", func(t *testing.T) {
		t.Parallel()
		s := schedule(none)
		_, ok := s.Repoll()
		require.False(t, ok, "no pause yet")
		require.Equal(t, 10*time.Millisecond, s.Pause(false, poll.Unknown, 0))
		_, ok = s.Repoll()
		require.False(t, ok, "a polling pause stands")
		require.Equal(t, 5*time.Second, s.Pause(true, poll.Unknown, 0))
		p, ok := s.Repoll()
		require.True(t, ok)
		require.Equal(t, 20*time.Millisecond, p, "the polling step it was at")
		_, ok = s.Repoll()
		require.False(t, ok, "once")
		require.Equal(t, 40*time.Millisecond, s.Pause(false, poll.Unknown, 0))
		s.Pause(true, poll.Live, 10*time.Millisecond)
		p, _ = s.Repoll()
		require.Equal(t, 11*time.Millisecond, p, "still at the holder's expiry")
	})

	t.Run("PausesForTheSafetyNetWhileNotified", func(t *testing.T) {
		t.Parallel()
		require.Equal(t, 5*time.Second, schedule(none).Pause(true, poll.Unknown, 0))
		require.Equal(t, 2500*time.Millisecond, schedule(full).Pause(true, poll.Live, time.Hour))
		require.Equal(t, 5*time.Second, schedule(nil).Pause(true, poll.Unknown, 0), "no jitter")
	})

	t.Run("KeepsItsPollingStepAcrossNotifiedPauses", func(t *testing.T) {
		t.Parallel()
		s := schedule(none)
		require.Equal(t, 10*time.Millisecond, s.Pause(false, poll.Unknown, 0))
		s.Pause(true, poll.Unknown, 0)
		require.Equal(t, 20*time.Millisecond, s.Pause(false, poll.Unknown, 0), "notifications stopped: polling resumes where it was")
	})
}
