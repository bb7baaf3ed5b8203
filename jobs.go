package pglease

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease/internal/flight"
	"github.com/pglease/pglease/internal/keys"
)

// shortestTTL is the shortest TTL of the Locker's leases: its own, or that
// of any job made by Job. The watchdog checks the trust of every lease this
// often (watchSlice).
func (l *Locker) shortestTTL() time.Duration { return time.Duration(l.minTTL.Load()) }

var _ gocron.Locker = (*JobLocker)(nil)

// JobLocker claims leases of one Locker on terms of its own (TTL, min hold,
// timeout); Held, Guard and Close treat its leases as the Locker's. Make one
// with Locker.Job, for gocron.WithDistributedJobLocker. It is safe for
// concurrent use.
type JobLocker struct {
	locker *Locker
	terms  terms
}

// Job returns a JobLocker that claims leases of l with the TTL, min hold and
// timeout its options give (WithTTL, WithMinHold, WithTimeout); the rest is
// l's. Terms that fail NewLocker's rules wrap ErrInvalidOption. It sends
// nothing to the database. See docs/GUIDE.md, "Locker.Job".
func (l *Locker) Job(opts ...Option) (*JobLocker, error) {
	t := l.terms()
	c := config{ttl: t.ttl, minHold: t.minHold, timeout: t.timeout}
	c.apply(atJob, opts)
	t, err := l.ownTerms("Job", c)
	if err != nil {
		return nil, err
	}
	return &JobLocker{locker: l, terms: t}, nil
}

// ownTerms checks the terms c of a job or an Elector (who) against the
// Locker whose heartbeat extends them, and makes them known to it: its
// watchdog and its clock-skew bound follow the shortest.
func (l *Locker) ownTerms(who string, c config) (terms, error) {
	if c.catchUp && c.period == 0 && c.cron == nil {
		c.invalid("WithCatchUp", "%s: WithCatchUp: only a job of ticks catches up on a lapsed run: give WithPeriod or WithCron too", who)
	}
	if c.period > 0 && c.cron != nil {
		c.invalid("WithCron", "%s: WithCron(%q) and WithPeriod(%v): a job has one schedule: give one of them", who, c.crontab, c.period)
	}
	if c.catchUp && l.cfg.noFence {
		c.invalid("WithCatchUp", "%s: WithCatchUp: a catch-up runs a tick again only when its run lapsed, and a table WithoutFenceColumn, "+
			"which has no released_at column, cannot tell a lapsed run from a released one: run Migrate, or schedule the job without WithCatchUp", who)
	}
	if len(c.errs) == 0 {
		// The rules of newConfig, with the heartbeat interval the Locker
		// has: it extends these leases too.
		if l.cfg.heartbeat*2 >= c.ttl {
			c.invalid("WithTTL", "%s: WithTTL(%v): the Locker's heartbeat interval (%v), which extends every lease of the Locker, must be less than TTL/2: give a TTL over %v, or the Locker a shorter WithHeartbeatInterval", who, c.ttl, l.cfg.heartbeat, 2*l.cfg.heartbeat)
		}
		if c.minHold > c.ttl {
			whose := "WithMinHold"
			if !c.minHoldSet {
				whose = "the Locker's WithMinHold"
			}
			c.invalid("WithMinHold", "%s: %s(%v): must not exceed the job's TTL (%v)", who, whose, c.minHold, c.ttl)
		}
	}
	if err := errors.Join(c.errs...); err != nil {
		return terms{}, err
	}
	if lower(&l.minTTL, c.ttl) {
		// A lease of the new job must not wait for a longer TTL's slice of
		// the watchdog to be found past its trust deadline.
		l.watchdog.Cut()
	}
	if c.minHold > 0 {
		lower(&l.minHold, c.minHold)
	}
	t := terms{ttl: c.ttl, minHold: c.minHold, timeout: c.timeout}
	if c.period > 0 || c.cron != nil {
		t.ticks = &ticks{period: c.period, crontab: c.crontab, cron: c.cron, catchUpOn: c.catchUp}
	}
	return t, nil
}

// Claim is Locker.Claim with the job's TTL and min hold.
func (j *JobLocker) Claim(ctx context.Context, key string) (*Lease, error) {
	mustContext(ctx, "Claim")
	return j.locker.claim(ctx, key, j.terms, reentrant, flight.Call{})
}

// Lock implements gocron.Locker, as Locker.Lock does, with the job's terms
// and timeout. Pass it to gocron.WithDistributedJobLocker.
func (j *JobLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	mustContext(ctx, "Lock")
	return j.locker.lock(ctx, key, j.terms)
}

// lower sets v to d if d is shorter, or v is 0 (none yet), and reports
// whether it did.
func lower(v *atomic.Int64, d time.Duration) bool {
	for {
		cur := v.Load()
		if cur != 0 && int64(d) >= cur {
			return false
		}
		if v.CompareAndSwap(cur, int64(d)) {
			return true
		}
	}
}

// Task returns a gocron task and the gocron.WithName option of a job named
// name, its lease's key, for a scheduler whose locker is l or a JobLocker of
// l. run gets the run's lease and a context that ends with it; its error
// goes to gocron and marks a tick's run failed. A run that finds no lease is
// skipped (EventRunWithoutLease). A bad name panics. See docs/GUIDE.md,
// "Locker.Task".
func (l *Locker) Task(name string, run func(ctx context.Context, lease *Lease) error) (gocron.Task, gocron.JobOption) {
	if err := keys.Check(name); err != nil {
		panic("pglease: Task: " + err.Error())
	}
	if run == nil {
		panic("pglease: Task: run is nil")
	}
	task := gocron.NewTask(func(ctx context.Context) error {
		lease, ok := l.Held(name)
		if !ok {
			l.once(name, Event{Kind: EventRunWithoutLease, Key: name, Err: errRunWithoutLease})
			return nil
		}
		ctx, cancel := lease.Context(ctx)
		defer cancel()
		err := run(ctx, lease)
		if err != nil {
			lease.failed.Store(true) // before gocron's Unlock, which follows the task's return
		}
		return err
	})
	return task, gocron.WithName(name)
}

// errRunWithoutLease is the Err of EventRunWithoutLease.
var errRunWithoutLease = errors.New("pglease: a run of the job found no lease under its name, and was skipped: " +
	"its lease ended before the run started, or the job's gocron.WithName is not the name given to Task (pass Task's own option); " +
	"reported once per job")
