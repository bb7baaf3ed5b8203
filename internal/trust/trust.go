// Package trust keeps the local side of a lease's trust window: the
// deadline past which a holder stops believing in its lease, reckoned on
// both local clocks, and the watchdog that checks it on a schedule of its
// own.
//
// The monotonic clock is immune to wall-clock steps, but it stands still
// while the host or VM is suspended, and so do Go's timers: after a resume
// it would trust a lease the server expired long ago. The wall clock
// counts the suspend. A Deadline holds until the earlier of the two has
// passed.
//
// What the package guarantees:
//
//   - A Deadline set at sent for d has passed once either clock shows more
//     than d since sent: a wall clock stepped back leaves the monotonic
//     deadline in force, and one stepped forward (NTP, a resume) only ends
//     trust early, which is safe.
//   - A Watchdog, once started, wakes every Slice and runs Check while
//     Keep holds, and never again once stopped.
package trust

import (
	"sync/atomic"
	"time"
)

// Clock reads the wall clock of time.Now() values. The zero value is the
// system's clock; Shift moves it from the system's, as a suspend or a step
// of the system clock would, while monotonic readings run on unchanged.
type Clock struct {
	shift atomic.Int64 // time.Duration
}

// Wall is the wall-clock reading of t, a time.Now() value, stripped of its
// monotonic reading so that comparisons use the wall clock.
func (c *Clock) Wall(t time.Time) time.Time {
	if c == nil {
		return t.Round(0)
	}
	return t.Round(0).Add(time.Duration(c.shift.Load()))
}

// Shift makes the clock's wall readings d later than the system's from now
// on (earlier for a negative d): what a process sees after its host was
// suspended for d, or after a step of the system clock.
func (c *Clock) Shift(d time.Duration) { c.shift.Store(int64(d)) }

// Deadline is the deadline d after sent, a time.Now() value, on both
// clocks.
func (c *Clock) Deadline(sent time.Time, d time.Duration) Deadline {
	return Deadline{mono: sent.Add(d), wall: c.Wall(sent).Add(d), clock: c}
}

// Deadline is a deadline reckoned on both local clocks. The zero Deadline
// has long passed.
type Deadline struct {
	mono  time.Time // with a monotonic reading
	wall  time.Time // wall clock only
	clock *Clock    // whose wall clock
}

// Left is how long d still holds at now, a time.Now() value: zero or less
// once either clock has passed it.
func (d Deadline) Left(now time.Time) time.Duration {
	return min(d.mono.Sub(now), d.wall.Sub(d.clock.Wall(now)))
}
