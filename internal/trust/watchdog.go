package trust

import (
	"sync"
	"time"
)

// Watchdog wakes on a schedule of its own, one timer for whatever it
// watches: Go's timers run on the monotonic clock, so a per-deadline timer
// sleeps through a suspend and fires long after the wall clock has passed
// its deadline; a watchdog that wakes every Slice finds it within one
// slice of the resume. Its fields are set before Start and not changed
// after.
type Watchdog struct {
	// Slice is how long each sleep lasts; it is read at every sleep.
	Slice func() time.Duration
	// Check runs at every wake, without the Watchdog's lock.
	Check func()
	// Keep reports, after each Check, whether to sleep again; it runs with
	// the Watchdog's lock held, so that a Start racing with the decision
	// is never lost, and must not call the Watchdog.
	Keep func() bool

	mu      sync.Mutex
	timer   *time.Timer
	on      bool // armed
	stopped bool
}

// Start arms the watchdog unless it is armed or stopped.
func (w *Watchdog) Start() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on || w.stopped {
		return
	}
	w.on = true
	if w.timer == nil {
		w.timer = time.AfterFunc(w.Slice(), w.wake)
	} else {
		w.timer.Reset(w.Slice())
	}
}

// Cut cuts the current sleep to Slice, which has just been shortened.
func (w *Watchdog) Cut() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.on {
		w.timer.Reset(w.Slice())
	}
}

// Stop disarms the watchdog for good: Start does nothing after it. A wake
// already running finishes its Check and does not sleep again.
func (w *Watchdog) Stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.on, w.stopped = false, true
	if w.timer != nil {
		w.timer.Stop()
	}
}

// wake runs Check, and sleeps again while Keep says so; otherwise the
// watchdog is disarmed until the next Start.
func (w *Watchdog) wake() {
	w.Check()
	w.mu.Lock()
	defer w.mu.Unlock()
	if !w.on {
		return // stopped
	}
	if !w.Keep() {
		w.on = false
		return
	}
	w.timer.Reset(w.Slice())
}
