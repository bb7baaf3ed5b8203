package pglease

import (
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// StartOnGrid is the gocron job option that puts a gocron.DurationJob of
// that period on the period's grid: its runs fall on the multiples of
// period since the Unix epoch, the same instants on every replica, whenever
// each replica was started. Every minute is then at second 0 of each
// minute, every 10s at :00, :10, :20 ..., every 24h at midnight UTC. The
// first run is the first multiple at or after the moment the scheduler
// schedules the job: never at once, and never a run for a multiple that
// passed before. Give it the DurationJob's own period (a multiple of it
// works too):
//
//	_, err := s.NewJob(gocron.DurationJob(time.Minute), task,
//		gocron.WithName("send-invoices"),
//		pglease.StartOnGrid(time.Minute),
//	)
//
// Without it a DurationJob's timer starts when its process starts, so
// replicas started at different moments fire out of phase, and a min hold
// merges only the claims of one tick that arrive within it of each other:
// each replica then runs "its" tick (replicas started a third of the
// period apart, with a min hold of half the period, run the job 1.5 times
// per period). A gocron.CronJob is on the wall clock already, when every
// replica has the same location.
//
// With ticks aligned, each tick runs exactly once when
//
//	D < H, H + D <= period, and run + D <= period, with H the min hold (WithMinHold)
//
// where D is the spread of the claims around their ticks: every claim of
// tick t reaches the database between t+a and t+a+D, for some a (the
// disagreement of the replicas' clocks plus the spread of their claims'
// latencies; milliseconds under NTP), and run is the job's run time, from
// its claim to its release as the database sees them. The first condition
// makes every later claim of a tick find the lease held; the other two end
// the lease before the next tick's first claim, so that any replica, not
// only the last holder, can take that tick. A min hold of half the period
// needs D below half the period and a run shorter than the period minus D.
//
// StartOnGrid reads the wall clock (time.Now), not a clock given to the
// scheduler with gocron.WithClock. It sets the job's start
// (gocron.WithStartAt): a later WithStartAt replaces it. It panics with an
// *OptionError when period is not positive.
func StartOnGrid(period time.Duration) gocron.JobOption {
	if period <= 0 {
		panic(&OptionError{Option: "StartOnGrid", msg: fmt.Sprintf("StartOnGrid(%v): the period must be positive", period)})
	}
	// A start on the grid in the past, not the next one: gocron moves a
	// past start forward by whole periods to the first at or after the
	// moment it schedules the job, so the first run is on the grid however
	// long after this call the scheduler starts, and the option never fails
	// (WithStartDateTime refuses a start that passed by the time NewJob
	// runs).
	return gocron.WithStartAt(gocron.WithStartDateTimePast(gridFloor(time.Now(), period)))
}

// gridFloor is the last multiple of period since the Unix epoch at or
// before t.
func gridFloor(t time.Time, period time.Duration) time.Time {
	ns, p := t.UnixNano(), int64(period)
	off := ns % p
	if off < 0 {
		off += p // before 1970
	}
	return time.Unix(0, ns-off)
}
