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
//     expiry (plus Margin): a lapsed lease notifies nobody. Once such an
//     attempt has found the lease extended (a heartbeat beat it, or
//     another holder took the key), expiries no longer shorten a pause
//     below the current step while polling, nor below Max while notified:
//     a short lease kept alive by its heartbeat costs no more than a long
//     one, and its lapse is seen within a step (at most Max) of its
//     expiry.
//   - A missing row is tried at once.
//   - When notifications stop arriving, Repoll turns the notified pause
//     just given into the polling pause the same attempt would have had.
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

	step     time.Duration // the next polling step; 0 before the first
	targeted bool          // the last pause ended at the holder's expiry
	beaten   bool          // an attempt at an expiry found the lease extended
	notified bool          // the last pause was a notified one
	h        Holder        // what the last attempt read of the holder
	left     time.Duration
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
// It is called once per attempt that found the key held.
func (s *Schedule) Pause(notified bool, h Holder, left time.Duration) time.Duration {
	if s.step == 0 {
		s.step = s.Min
	}
	// An attempt made at the holder's expiry that finds more than a step's
	// worth left was beaten by an extension, not by a timer a little
	// fast: the holder is alive, its expiries are no reason to hurry.
	if s.targeted && h == Live && left > s.Min {
		s.beaten = true
	}
	s.h, s.left = h, left
	return s.pause(notified)
}

// Repoll is the pause, counted from the same attempt as the last Pause,
// that replaces it now that notifications no longer arrive: the polling
// pause it would have had. ok is false when the last pause was a polling
// one already (or there was none): it stands.
func (s *Schedule) Repoll() (pause time.Duration, ok bool) {
	if s.step == 0 || !s.notified {
		return 0, false
	}
	return s.pause(false), true
}

func (s *Schedule) pause(notified bool) time.Duration {
	s.notified, s.targeted = notified, false
	var pause, floor time.Duration
	if notified {
		pause = s.Notified - s.jitter(s.Notified/2)
		floor = s.Max
	} else {
		pause = s.step + s.jitter(s.step/4)
		floor = s.step
		s.step = min(2*s.step, s.Max)
	}
	switch s.h {
	case Live:
		at := max(s.left+s.Margin, 0)
		if s.beaten {
			at = max(at, floor)
		}
		if at < pause {
			pause, s.targeted = at, true
		}
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
