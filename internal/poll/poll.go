// Package poll is the schedule of a waiting claim: how long it pauses,
// after an attempt that found the key held, before it tries again.
//
// What a Schedule guarantees:
//
//   - While polling, the pauses grow from Min, doubling, up to Max, and a
//     pause is never shorter than the current step: once the steps reach
//     Max, a waiter tries at most once per Max, however many attempts it
//     makes. The jitter only lengthens a pause, by up to a quarter.
//   - While notified (a release wakes the waiter anyway), the pause is
//     Notified, less up to half of it: a safety net.
//   - A holder whose lease has left less than the pause is tried at its
//     expiry (plus Margin): a lapsed lease notifies nobody. A missing row
//     is tried at once.
package poll

import "time"

// Schedule is the pauses of one waiting claim. The zero value is not
// usable: set Min, Max and Notified.
type Schedule struct {
	Min, Max time.Duration // the first polling step, and the last
	Notified time.Duration // the pause while notifications arrive
	Margin   time.Duration // added to the holder's remaining time
	// Jitter returns a random duration in [0, d]; nil adds none.
	Jitter func(d time.Duration) time.Duration

	step time.Duration // the next polling step; 0 before the first
}

// Holder is what a waiter knows of the lease that keeps it waiting.
type Holder int

const (
	// Unknown means the holder's remaining time could not be read.
	Unknown Holder = iota
	// Live means the holder's lease has left (Pause's argument) to run.
	Live
	// Missing means the key has no row any more: try at once.
	Missing
)

// Pause returns the pause before the next attempt: notified says whether
// notifications arrive, h and left what the waiter read of the holder.
func (s *Schedule) Pause(notified bool, h Holder, left time.Duration) time.Duration {
	if s.step == 0 {
		s.step = s.Min
	}
	var pause time.Duration
	if notified {
		pause = s.Notified - s.jitter(s.Notified/2)
	} else {
		pause = s.step + s.jitter(s.step/4)
		s.step = min(2*s.step, s.Max)
	}
	switch h {
	case Live:
		pause = min(pause, max(left+s.Margin, 0))
	case Missing:
		pause = 0
	}
	return pause
}

func (s *Schedule) jitter(d time.Duration) time.Duration {
	if s.Jitter == nil || d <= 0 {
		return 0
	}
	return min(max(s.Jitter(d), 0), d)
}
