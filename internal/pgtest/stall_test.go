package pgtest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestStallWatch(t *testing.T) {
	t.Parallel()
	t.Run("KeepsTheLongestDelayPastItsPeriod", func(t *testing.T) {
		t.Parallel()
		at := time.Unix(1000, 0)
		w := &StallWatch{last: at}
		ms := time.Millisecond
		for _, step := range []time.Duration{10 * ms, 12 * ms, 250 * ms, 11 * ms, 40 * ms} {
			at = at.Add(step)
			w.note(at)
		}
		assert.Equal(t, 240*time.Millisecond, w.Longest(), "the wake-up 250 ms after the last, 240 past its period")
	})
	t.Run("StopsOnceAndEnds", func(t *testing.T) {
		t.Parallel()
		w := WatchStalls(t)
		time.Sleep(5 * stallPeriod)
		first := w.Stop()
		assert.Equal(t, first, w.Stop(), "a second Stop returns what the first did")
		select {
		case <-w.done:
		default:
			t.Fatal("the watch's goroutine still runs after Stop")
		}
	})
}
