package pglease

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// WithPeriod makes a job's claims claim ticks: each claim takes the lease
// for the tick of the period's grid (multiples of period since the Unix
// epoch) nearest the database server's clock, and only if no claim took
// that tick or a later one. Each tick then runs at most once, whatever the
// job's duration, the min hold (none is needed) and the replicas' clocks,
// as long as they are off by less than half the period; a claim of a tick
// already taken, or made while the run of an earlier tick holds the key, is
// ErrHeld and gocron skips it. Only Locker.Job takes it, and not with
// WithoutFenceColumn. Schedule the job with JobLocker.Schedule, so that its
// schedule is written once. See docs/GUIDE.md, "Ticks".
func WithPeriod(period time.Duration) Option {
	return Option{"WithPeriod", atJob, "a period is a job's: give it to Locker.Job",
		durationOption("WithPeriod", period, time.Millisecond, "the period must be at least 1ms",
			func(c *config) { c.period = period })}
}

// ticks are the instants of a job's schedule, the multiples of period
// since the Unix epoch: the claims of the job claim one of them each, the
// one nearest the server's clock (sqlstmt.ClaimTick).
type ticks struct {
	period time.Duration
}

// tickRefused is ErrHeld for a claim of a tick that took nothing, saying
// why from the row as the claim found it.
func tickRefused(tick, rowTick time.Time, holder string, fence int64, live bool) error {
	at := tick.UTC().Format(time.RFC3339Nano)
	switch {
	case !rowTick.IsZero() && !rowTick.Before(tick) && live:
		return fmt.Errorf("tick %s taken by %s (fence %d), its run holding the key: %w", at, holder, fence, ErrHeld)
	case !rowTick.IsZero() && !rowTick.Before(tick):
		return fmt.Errorf("tick %s already taken (by %s, fence %d): %w", at, holder, fence, ErrHeld)
	case live && !rowTick.IsZero():
		return fmt.Errorf("tick %s skipped: the run of tick %s (%s, fence %d) still holds the key: %w",
			at, rowTick.UTC().Format(time.RFC3339Nano), holder, fence, ErrHeld)
	case live:
		return fmt.Errorf("tick %s skipped: %s (fence %d) holds the key: %w", at, holder, fence, ErrHeld)
	}
	return fmt.Errorf("tick %s: %w", at, ErrHeld)
}

// Schedule adds the job to s on its schedule (WithPeriod: every period,
// its first run on the period's grid) with j as its distributed locker, and
// opts after those, so that the schedule is written once:
//
//	payouts, err := locker.Job(pglease.WithPeriod(time.Minute))
//	task, named := locker.Task("payouts", pay)
//	_, err = payouts.Schedule(s, task, named)
//
// A JobLocker made without WithPeriod has no schedule: Schedule returns an
// error and adds nothing.
func (j *JobLocker) Schedule(s gocron.Scheduler, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	if j.terms.ticks == nil {
		return nil, errors.New("pglease: Schedule: the job has no schedule: make it with Locker.Job(pglease.WithPeriod(...))")
	}
	p := j.terms.ticks.period
	all := append([]gocron.JobOption{
		gocron.WithStartAt(gocron.WithStartDateTimePast(gridFloor(time.Now(), p))),
		gocron.WithDistributedJobLocker(j),
	}, opts...)
	return s.NewJob(gocron.DurationJob(p), task, all...)
}
