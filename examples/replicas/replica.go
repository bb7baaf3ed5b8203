package main

import (
	"context"
	"errors"
	"hash/fnv"
	"log/slog"
	"math/rand/v2"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// jobName is the gocron job's name, and so the lease key every replica
// claims: gocron calls Lock(ctx, jobName) before each run.
const jobName = "demo-tick"

// replica is one instance of the service: its own pool, its own Locker, its
// own gocron scheduler, as if it ran on another machine.
type replica struct {
	name    string
	lag     time.Duration // how slow its clock is: its claims reach the database this late
	startAt time.Duration // when it starts, after the first replica
	db      *cuttableDB
	pool    *pgxpool.Pool
	locker  *pglease.Locker
	job     *pglease.JobLocker // the job of ticks, with catch-up; nil with -ticks=false
	sched   gocron.Scheduler
	tl      *timeline
	kill    *killSwitch // nil when this replica is never killed
	maxWork time.Duration

	rngMu sync.Mutex
	rng   *rand.Rand // the job's durations
}

// leastWork is the shortest run of the job.
const leastWork = 3 * time.Millisecond

// maxWork is the longest run of the job: a tenth of the period, at most
// 100ms. Short enough that, with -min-hold 0, a run ends before the claim
// of a replica whose clock is a little slower arrives.
func maxWork(period time.Duration) time.Duration {
	return max(2*leastWork, min(100*time.Millisecond, period/10))
}

func newReplica(ctx context.Context, cfg config, name string, lag, startAt time.Duration, dsn string,
	tl *timeline, kill *killSwitch, logger *slog.Logger, seed uint64) (*replica, error) {
	pcfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	pcfg.MaxConns = 4
	pool, err := pgxpool.NewWithConfig(ctx, pcfg)
	if err != nil {
		return nil, err
	}
	// Connect now, as a service does at start-up, rather than in the first
	// claim: gocron schedules a job's next run only once Lock returns, so a
	// slow first connection would shift that replica's first ticks.
	if err := pool.Ping(ctx); err != nil {
		pool.Close()
		return nil, err
	}
	r := &replica{
		name:    name,
		lag:     lag,
		startAt: startAt,
		db:      &cuttableDB{db: pool},
		pool:    pool,
		tl:      tl,
		kill:    kill,
		maxWork: maxWork(cfg.period),
		rng:     rand.New(rand.NewPCG(seed, fnv64(name))),
	}
	r.locker = pglease.NewLocker(r.db,
		pglease.WithHolder(name),
		pglease.WithTable(cfg.table),
		pglease.WithTTL(cfg.ttl),
		pglease.WithMinHold(cfg.minHold),
		// The replica's DB is no *pgxpool.Pool but the pool behind a
		// switch: catch-up waits listen for releases on a connection of
		// their own rather than poll.
		pglease.WithListenDSN(dsn),
		pglease.WithLogger(logger),
		pglease.WithHook(tl.event),
	)
	if cfg.ticks {
		// README's quick start: each tick claimed once, judged on the
		// database's clock; and a run that lapses is caught up.
		r.job, err = r.locker.Job(pglease.WithPeriod(cfg.period), pglease.WithCatchUp())
	}
	if err == nil {
		r.sched, err = gocron.NewScheduler()
	}
	if err != nil {
		_ = r.locker.Close(context.Background())
		pool.Close()
		return nil, err
	}
	return r, nil
}

// start schedules the job every period and starts the scheduler. With
// ticks, as README's quick start does: the JobLocker's Schedule, on the
// period's grid. Otherwise the timing-only way: a DurationJob on the
// period's grid (pglease.StartOnGrid), or with -schedule immediately from
// now, as the quick start did before either.
func (r *replica) start(period time.Duration, schedule string) error {
	task, named := r.locker.Task(jobName, r.run)
	// The replica's claims reach the database as late as its clock is
	// slow: the job's locker, behind its clock. Schedule puts the options
	// given after its own, so this one is the job's.
	var locker gocron.Locker = r.locker
	if r.job != nil {
		locker = r.job
	}
	slow := gocron.WithDistributedJobLocker(slowClock{locker, r.lag})
	var (
		j   gocron.Job
		err error
	)
	switch {
	case r.job != nil:
		j, err = r.job.Schedule(r.sched, task, named, slow)
	case schedule == immediately:
		j, err = r.sched.NewJob(gocron.DurationJob(period), task, named, slow,
			gocron.WithStartAt(gocron.WithStartImmediately()))
	default:
		j, err = r.sched.NewJob(gocron.DurationJob(period), task, named, slow, pglease.StartOnGrid(period))
	}
	if err != nil {
		return err
	}
	at := time.Now()
	r.sched.Start()
	first, err := j.NextRun()
	if err != nil {
		return err
	}
	r.tl.started(r.name, at, first)
	return nil
}

// slowClock is the gocron.Locker of a replica whose clock is lag slow: its
// timers fire lag late, so its claims reach the database lag after those of
// a replica whose clock is right. One machine has one clock; the demo
// delays the claim instead.
type slowClock struct {
	gocron.Locker
	lag time.Duration
}

func (c slowClock) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	if err := sleep(ctx, c.lag); err != nil {
		return nil, err
	}
	return c.Locker.Lock(ctx, key)
}

// run is the job's task (Locker.Task): gocron runs it only once the job's
// locker has returned a lease, which it gets, with a context that ends the
// moment the lease does: if the heartbeat finds the lease taken, or cannot
// renew it within the TTL, the run stops instead of overlapping with the
// next holder's.
func (r *replica) run(ctx context.Context, lease *pglease.Lease) error {
	rn := r.tl.begin(r.name, lease.Fence(), time.Now(), lease.Tick())
	err := r.work(ctx, rn)
	r.tl.end(rn, err)
	return err
}

// work stands for the job's real work, a few to ~100ms. A real job would
// pass rn.fence (lease.Fence()) with every write, so that a downstream that
// remembers the greatest fence it saw can refuse a stale holder.
func (r *replica) work(ctx context.Context, rn *jobRun) error {
	d := r.workDuration()
	if err := sleep(ctx, d/2); err != nil {
		return err
	}
	if r.kill.fire(time.Now()) {
		r.die(rn)
	}
	return sleep(ctx, d-d/2)
}

func (r *replica) workDuration() time.Duration {
	r.rngMu.Lock()
	defer r.rngMu.Unlock()
	return leastWork + time.Duration(r.rng.Int64N(int64(r.maxWork-leastWork)+1))
}

// die kills the replica mid-run, as a crash would: its database access
// stops dead, so neither its heartbeat nor gocron's Unlock reach the server
// and the lease stays in the table until its TTL runs out; and its
// scheduler shuts down, which cancels this very run. Shutdown waits for the
// run to return, so it runs on a goroutine of its own, counted in the kill
// switch's wait group by fire.
func (r *replica) die(rn *jobRun) {
	r.db.cut()
	r.tl.killed(rn)
	go func() {
		defer r.kill.wg.Done()
		_ = r.sched.Shutdown()
	}()
}

func (r *replica) dead() bool { return r.db.isCut() }

// stop shuts the scheduler down (unless the replica was killed: die did),
// closes the Locker, which releases any lease still held, and the pool.
func (r *replica) stop(ctx context.Context) error {
	var errs []error
	if !r.dead() {
		if err := r.sched.Shutdown(); err != nil {
			errs = append(errs, err)
		}
	}
	if err := r.locker.Close(ctx); err != nil && !r.dead() {
		errs = append(errs, err)
	}
	r.pool.Close()
	return errors.Join(errs...)
}

// killSwitch kills one replica: the first whose run is halfway through at
// or after at, unless the demo is stopping already.
type killSwitch struct {
	at time.Time
	wg sync.WaitGroup // the killed replica's scheduler shutdown

	mu   sync.Mutex
	used bool // fired, or disarmed
}

// fire reports whether the caller is the one to kill, and if so counts the
// shutdown it will start in wg.
func (k *killSwitch) fire(now time.Time) bool {
	if k == nil {
		return false
	}
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.used || now.Before(k.at) {
		return false
	}
	k.used = true
	k.wg.Add(1)
	return true
}

// disarmAndWait makes sure no kill starts any more, and waits for the
// killed replica's shutdown, if any.
func (k *killSwitch) disarmAndWait() {
	if k == nil {
		return
	}
	k.mu.Lock()
	k.used = true
	k.mu.Unlock()
	k.wg.Wait()
}

// errKilled is what every database call of a killed replica returns.
var errKilled = errors.New("replica killed: database unreachable")

// cuttableDB is a replica's road to PostgreSQL, with a switch that cuts it:
// once cut, every call fails before it reaches the server.
type cuttableDB struct {
	db   pglease.DB
	dead atomic.Bool
}

func (d *cuttableDB) cut()        { d.dead.Store(true) }
func (d *cuttableDB) isCut() bool { return d.dead.Load() }

func (d *cuttableDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if d.isCut() {
		return pgconn.CommandTag{}, errKilled
	}
	return d.db.Exec(ctx, sql, args...)
}

func (d *cuttableDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if d.isCut() {
		return nil, errKilled
	}
	return d.db.Query(ctx, sql, args...)
}

func (d *cuttableDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if d.isCut() {
		return errRow{errKilled}
	}
	return d.db.QueryRow(ctx, sql, args...)
}

func (d *cuttableDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if d.isCut() {
		return nil, errKilled
	}
	return d.db.Begin(ctx)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

// sleep waits for d, or until ctx ends, returning its cause.
func sleep(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

// fnv64 hashes a replica name into a seed.
func fnv64(s string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(s)) // never fails
	return h.Sum64()
}
