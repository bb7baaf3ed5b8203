package pglease

import (
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// StartOnGrid is the gocron job option that puts a DurationJob's runs on the
// multiples of period since the Unix epoch, the same instants on every
// replica; give it the job's period. The first run is the first multiple at
// or after the job is scheduled. It sets gocron.WithStartAt, and panics with
// an error wrapping ErrInvalidOption if period <= 0. See docs/GUIDE.md, "StartOnGrid".
func StartOnGrid(period time.Duration) gocron.JobOption {
	if period <= 0 {
		panic(&optionError{option: "StartOnGrid", msg: fmt.Sprintf("StartOnGrid(%v): the period must be positive", period)})
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
