// Package skew reads how far a local wall clock is from a server's, from
// samples taken around statements whose reply carries the server's clock.
//
// A statement sent at local wall time sent whose reply came back after a
// round trip of took, measured on the monotonic clock, and which read the
// server's clock while it ran, says that the server's clock is ahead by
//
//	Offset = server - (sent + took/2),  within ± took/2,
//
// whatever the split of the round trip between the two directions, as long
// as the local clock's rate is right over one round trip.
//
// What a Filter guarantees:
//
//   - Its reading is the sample with the smallest Uncertainty among the
//     last Window (as NTP's clock filter does: a delay only ever widens a
//     sample, it never makes a wrong one narrow); of equally narrow
//     samples, the newest.
//   - A sample whose interval does not meet the reading's (a clock
//     stepped) drops the older samples: the reading follows a step at once.
//   - Add reports each crossing of a bound once: up when the reading goes
//     beyond it, down when it comes back within.
package skew

import (
	"sync"
	"time"
)

// Sample is one reading of the offset of a server's clock from the local
// wall clock.
type Sample struct {
	// Offset is the server's clock minus the local wall clock: positive
	// when the server is ahead.
	Offset time.Duration
	// Uncertainty bounds the error: the true offset was within Offset ±
	// Uncertainty when the sample was taken (half its round trip).
	Uncertainty time.Duration
	// At is the local wall time of the sample; zero when there is none.
	At time.Time
}

// Measure is the sample of a statement sent at local wall time sent that
// read the server's clock as server and came back after took.
func Measure(server, sent time.Time, took time.Duration) Sample {
	half := took / 2
	return Sample{Offset: server.Sub(sent.Add(half)), Uncertainty: half, At: sent}
}

// Beyond is how far the offset is certainly beyond zero: |Offset| -
// Uncertainty, or 0 when the sample cannot tell the clocks apart.
func (s Sample) Beyond() time.Duration {
	return max(s.Offset.Abs()-s.Uncertainty, 0)
}

// Overlaps reports whether two samples can both be right: their intervals
// Offset ± Uncertainty meet.
func (s Sample) Overlaps(o Sample) bool {
	return (s.Offset - o.Offset).Abs() <= s.Uncertainty+o.Uncertainty
}

// Window is how many recent samples a Filter chooses its reading from.
const Window = 8

// Filter keeps the recent samples and the reading chosen from them. The
// zero value is ready to use.
type Filter struct {
	mu      sync.Mutex
	samples []Sample // oldest first, at most Window
	reading Sample
	beyond  bool // the reading is beyond the last bound
}

// Add records a sample and returns the new reading, and whether it just
// crossed bound (up: now beyond it; down: back within).
func (f *Filter) Add(s Sample, bound time.Duration) (reading Sample, up, down bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if len(f.samples) > 0 && !s.Overlaps(f.reading) {
		f.samples = f.samples[:0]
	}
	if len(f.samples) == Window {
		f.samples = append(f.samples[:0], f.samples[1:]...)
	}
	f.samples = append(f.samples, s)
	f.reading = f.samples[0]
	for _, x := range f.samples[1:] {
		if x.Uncertainty <= f.reading.Uncertainty {
			f.reading = x // the newest of the narrowest
		}
	}
	beyond := f.reading.Beyond() > bound
	up, down = beyond && !f.beyond, !beyond && f.beyond
	f.beyond = beyond
	return f.reading, up, down
}

// Get returns the reading, and false before the first sample.
func (f *Filter) Get() (Sample, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.reading, !f.reading.At.IsZero()
}
