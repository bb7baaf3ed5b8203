package pglease

import (
	"errors"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease/internal/crontab"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// WithPeriod makes a job's claims claim ticks: each takes the lease for the
// multiple of period since the Unix epoch nearest the database's clock, if
// no claim took that tick or a later one, so each tick runs at most once
// while the replicas' clocks agree within half the period. A tick taken, or
// held by an earlier run, is ErrHeld. Only for Locker.Job. See
// docs/GUIDE.md, "Ticks".
func WithPeriod(period time.Duration) Option {
	return Option{"WithPeriod", atJob, "a period is a job's: give it to Locker.Job",
		durationOption("WithPeriod", period, time.Millisecond, "the period must be at least 1ms",
			func(c *config) { c.period = period })}
}

// WithCron makes a job's claims claim the instants of crontab tab, read as
// gocron's CronJob(tab, true) reads it, in UTC unless it begins with
// CRON_TZ=. The replicas' clocks must agree within half the shortest gap
// between instants. Only for Locker.Job. See docs/GUIDE.md, "Ticks".
func WithCron(tab string) Option {
	return Option{"WithCron", atJob, "a schedule is a job's: give it to Locker.Job",
		func(c *config) {
			zoned, s, err := crontab.Parse(tab)
			if err != nil {
				c.invalid("WithCron", "WithCron(%q): %v", tab, err)
				return
			}
			c.crontab, c.cron = zoned, s
		}}
}

// ticks are the instants of a job's schedule, the multiples of period
// since the Unix epoch or the instants of a crontab: the claims of the job
// claim one of them each, the one nearest the server's clock
// (sqlstmt.ClaimTick).
type ticks struct {
	period    time.Duration
	crontab   string        // WithCron, with its zone; period is 0
	cron      cron.Schedule // crontab's
	catchUpOn bool          // WithCatchUp: a tick whose run lapsed is run once more
	catchUp   time.Time     // the tick a catch-up claims; zero for the nearest
}

// claim is what a claim of the job sends: the period, or the instants of
// the crontab around now, one of which is nearest the server's clock.
func (tk *ticks) claim(now time.Time) (driver.Ticks, error) {
	d := driver.Ticks{Period: tk.period, CatchUp: tk.catchUp}
	if tk.cron == nil {
		return d, nil
	}
	var err error
	d.Instants, err = crontab.InstantsAround(tk.cron, now)
	return d, err
}

// after is how long after tick the schedule's next tick comes.
func (tk *ticks) after(tick time.Time) time.Duration {
	if tk.cron == nil {
		return tk.period
	}
	return tk.cron.Next(tick).Sub(tick)
}

// WithCatchUp makes a job of ticks run a tick again when its run lapsed
// (expired unreleased: its holder killed or cut off): the other replicas
// wait for the lapse, at most the job's TTL and period, and one runs the
// tick with a greater fence. A tick then runs at least once while a replica
// lives, and twice only after a lapse: make the job idempotent. Only
// Locker.Job takes it, with WithPeriod or WithCron. See docs/GUIDE.md,
// "Ticks".
func WithCatchUp() Option {
	return Option{"WithCatchUp", atJob, "catching up is a job's: give it to Locker.Job, with WithPeriod",
		func(c *config) { c.catchUp = true }}
}

// tickHeldError is ErrHeld for a claim of a tick that took nothing, with the row
// as the claim found it, which says why.
type tickHeldError struct {
	tick, rowTick time.Time
	holder        string
	fence         int64
	live          bool
	released      bool
	run           bool // the row's lease is a run of rowTick
}

func (e *tickHeldError) Unwrap() error { return ErrHeld }

func (e *tickHeldError) Error() string {
	at := e.tick.UTC().Format(time.RFC3339Nano)
	fence := "" // none WithoutFenceColumn
	if e.fence != 0 {
		fence = fmt.Sprintf(", fence %d", e.fence)
	}
	switch {
	case !e.rowTick.IsZero() && !e.rowTick.Before(e.tick) && e.live:
		return fmt.Sprintf("tick %s taken by %s%s, its run holding the key", at, e.holder, fence)
	case !e.rowTick.IsZero() && !e.rowTick.Before(e.tick):
		return fmt.Sprintf("tick %s already taken (by %s%s)", at, e.holder, fence)
	case e.live && !e.rowTick.IsZero():
		return fmt.Sprintf("tick %s skipped: the run of tick %s (%s%s) still holds the key",
			at, e.rowTick.UTC().Format(time.RFC3339Nano), e.holder, fence)
	case e.live:
		return fmt.Sprintf("tick %s skipped: %s%s holds the key", at, e.holder, fence)
	case e.raced():
		return fmt.Sprintf("tick %s taken by a claim of another replica at the same time", at)
	}
	return fmt.Sprintf("tick %s held", at)
}

// raced reports whether the claim was refused though the row it read was
// free for the tick (none, or an earlier tick's no longer live): a claim
// of another replica committed the tick's row after the statement's
// snapshot, and the row read is not the one that refused it.
func (e *tickHeldError) raced() bool {
	return !e.live && (e.rowTick.IsZero() || e.rowTick.Before(e.tick))
}

// skipped reports whether the refusal is by the run of an earlier tick,
// still holding the key: the tick asked is skipped.
func (e *tickHeldError) skipped() bool {
	return e.live && !e.rowTick.IsZero() && e.rowTick.Before(e.tick)
}

// mayLapse reports whether the refusal is by a run of the very tick asked
// that was not released nor revoked: running, or lapsed already. A plain
// claim of the key, which keeps the row's tick, is no run of it.
func (e *tickHeldError) mayLapse() bool {
	return e.run && !e.rowTick.IsZero() && e.rowTick.Equal(e.tick) && !e.released && e.holder != sqlstmt.RevokedHolder
}

// Schedule adds the job to s with j as its locker, on the schedule j was
// made with (WithPeriod: a DurationJob on the period's grid; WithCron: a
// CronJob), then opts, so that the schedule is written once. Without one it
// returns an error. See docs/GUIDE.md, "JobLocker.Schedule".
func (j *JobLocker) Schedule(s gocron.Scheduler, task gocron.Task, opts ...gocron.JobOption) (gocron.Job, error) {
	tk := j.terms.ticks
	switch {
	case tk == nil:
		return nil, errors.New("pglease: Schedule: the job has no schedule: make it with Locker.Job(pglease.WithPeriod(...)) or WithCron(...)")
	case tk.cron != nil:
		return s.NewJob(gocron.CronJob(tk.crontab, true), task, append([]gocron.JobOption{gocron.WithDistributedJobLocker(j)}, opts...)...)
	}
	all := append([]gocron.JobOption{
		gocron.WithStartAt(gocron.WithStartDateTimePast(gridFloor(time.Now(), tk.period))),
		gocron.WithDistributedJobLocker(j),
	}, opts...)
	return s.NewJob(gocron.DurationJob(tk.period), task, all...)
}
