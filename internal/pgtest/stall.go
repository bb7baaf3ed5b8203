package pgtest

import (
	"sync"
	"testing"
	"time"
)

// stallPeriod is how often a StallWatch asks to be woken.
const stallPeriod = 10 * time.Millisecond

// StallWatch measures how late the test process wakes a goroutine that
// sleeps stallPeriod at a time: the longest delay past the sleep is how
// long a test bound by time may have been stalled by the machine (other
// tests, the race detector, the server on the same cores). A test whose
// margins are shorter than a stall seen during it cannot judge its case,
// and runs it again.
type StallWatch struct {
	mu      sync.Mutex
	last    time.Time
	longest time.Duration
	stop    chan struct{}
	done    chan struct{}
	once    sync.Once
}

// WatchStalls starts a StallWatch; Stop (or tb's cleanup) ends it.
func WatchStalls(tb testing.TB) *StallWatch {
	tb.Helper()
	w := &StallWatch{last: time.Now(), stop: make(chan struct{}), done: make(chan struct{})}
	go func() {
		defer close(w.done)
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(stallPeriod):
				w.note(time.Now())
			}
		}
	}()
	tb.Cleanup(func() { w.Stop() })
	return w
}

// note records a wake-up at now.
func (w *StallWatch) note(now time.Time) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if late := now.Sub(w.last) - stallPeriod; late > w.longest {
		w.longest = late
	}
	w.last = now
}

// Stop ends the watch and returns the longest stall it saw.
func (w *StallWatch) Stop() time.Duration {
	w.once.Do(func() {
		close(w.stop)
		<-w.done
		w.note(time.Now()) // a stall still under way counts too
	})
	return w.Longest()
}

// Longest is the longest stall seen so far.
func (w *StallWatch) Longest() time.Duration {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.longest
}
