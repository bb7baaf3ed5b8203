package pglease_test

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// scheduler is a started gocron scheduler with opts, shut down at cleanup.
func scheduler(t *testing.T, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown() })
	s.Start()
	return s
}

// TestTask: a gocron job named once by Locker.Task runs with its lease,
// and a job left with gocron's default name is reported.
func TestTask(t *testing.T) {
	t.Parallel()

	// The name given once is the job's gocron name and its lease's key;
	// the run works under a context that ends with the lease.
	t.Run("NamesTheJobOnceAndHandsItsLease", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		type seen struct {
			key    string
			fence  int64
			live   bool
			runCtx context.Context
			onHeld bool
		}
		ran := make(chan seen, 1)
		task, named := l.Task("nightly-report", func(ctx context.Context, lease *pglease.Lease) error {
			held, ok := l.Held("nightly-report")
			ran <- seen{key: lease.Key(), fence: lease.Fence(), live: ctx.Err() == nil, runCtx: ctx, onHeld: ok && held == lease}
			return nil
		})
		j, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, named)
		require.NoError(t, err)
		assert.Equal(t, "nightly-report", j.Name())
		var got seen
		select {
		case got = <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not run within 10s")
		}
		assert.Equal(t, "nightly-report", got.key)
		assert.Positive(t, got.fence)
		assert.True(t, got.live, "the run's context is live while the lease is held")
		assert.True(t, got.onHeld, "the lease handed to the run is the one Held finds")
		select {
		case <-got.runCtx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the run's context outlived the run")
		}
		assert.Zero(t, events.Count(pglease.EventUnnamedJob))
	})

	// The run's context ends the moment the lease is lost, with the loss
	// as its cause; a JobLocker's terms apply to the lease.
	t.Run("RunEndsWhenTheLeaseIsLost", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		job := mustJob(t, l, pglease.WithTTL(time.Minute))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		started, ended := make(chan *pglease.Lease, 1), make(chan error, 1)
		task, named := l.Task("long-run", func(ctx context.Context, lease *pglease.Lease) error {
			started <- lease
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil
		})
		_, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, named, gocron.WithDistributedJobLocker(job))
		require.NoError(t, err)
		var lease *pglease.Lease
		select {
		case lease = <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not start within 10s")
		}
		assert.Greater(t, lease.ExpiresAt().Sub(lease.AcquiredAt()), 30*time.Second, "claimed on the job's TTL")
		_, err = adminOf(t, pool, pglease.WithTable(table)).ForceExpire(ctx, "long-run")
		require.NoError(t, err)
		_, err = pgtest.Locker(t, pool, table, "replica-2").Claim(ctx, "long-run")
		require.NoError(t, err)
		select {
		case cause := <-ended:
			require.ErrorIs(t, cause, pglease.ErrLost)
		case <-time.After(10 * time.Second):
			t.Fatal("the run's context did not end within 10s of the loss")
		}
	})

	// A run that finds no lease under its name (the job renamed by a
	// WithName of its own, a lease lost before the run began) is skipped,
	// and reported once per job, however often it recurs: a job that never
	// runs is seen.
	t.Run("RunWithoutALeaseIsReportedOnce", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		var logs lockedBuffer
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook), pglease.WithLogger(jsonLogger(&logs)))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		ran := make(chan struct{}, 1)
		task, _ := l.Task("send-invoices", func(context.Context, *pglease.Lease) error { ran <- struct{}{}; return nil })
		_, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), task, gocron.WithName("send-invoice")) // the lease's key
		require.NoError(t, err)
		require.Eventually(t, func() bool { return events.Count(pglease.EventReleased) >= 3 }, 10*time.Second, 10*time.Millisecond,
			"three runs of the job, each claimed and released")
		select {
		case <-ran:
			t.Fatal("a run without its lease ran")
		default:
		}
		require.Equal(t, 1, events.Count(pglease.EventRunWithoutLease), "once per job, not per run")
		got := events.WaitFor(t, pglease.EventRunWithoutLease, time.Second)
		assert.Equal(t, "send-invoices", got.Key)
		assert.Contains(t, got.Err.Error(), "no lease")
		lines := loggedLines(t, &logs, pglease.EventRunWithoutLease)
		require.Len(t, lines, 1)
		assert.Equal(t, "WARN", lines[0]["level"])
	})

	t.Run("RefusesABadName", func(t *testing.T) {
		t.Parallel()
		l := pgtest.Each(pglease.NewLocker(pgtest.Pool(t, nil)))
		assert.Contains(t, panicMessage(func() { l.Task("", func(context.Context, *pglease.Lease) error { return nil }) }), "key is empty")
		assert.Contains(t, panicMessage(func() { l.Task("job", nil) }), "run is nil")
		require.NoError(t, l.Close(context.Background()))
	})

	// A job given no gocron.WithName gets the Go function's name, which
	// changes when the code moves: Lock reports it once, at error level,
	// however often the job runs, and the job still runs.
	t.Run("UnnamedJobIsReportedOnce", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		logged := &lockedBuffer{}
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelInfo}))))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		var runs atomic.Int32
		enough := make(chan struct{})
		_, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(func() {
			if runs.Add(1) == 3 {
				close(enough)
			}
		}))
		require.NoError(t, err)
		select {
		case <-enough:
		case <-time.After(10 * time.Second):
			t.Fatalf("the unnamed job ran %d times in 10s, not 3", runs.Load())
		}
		require.NoError(t, s.StopJobs())
		warned := events.WaitFor(t, pglease.EventUnnamedJob, time.Second)
		assert.Contains(t, warned.Key, "pglease_test.TestTask", "the key is the function's name")
		require.ErrorIs(t, warned.Err, pglease.ErrUnnamedJob)
		assert.Equal(t, 1, events.Count(pglease.EventUnnamedJob), "once per key")
		assert.Contains(t, logged.String(), "level=ERROR")
		assert.Contains(t, logged.String(), "unnamed_job")
	})

	// What is taken for a Go function's name, and what is not.
	t.Run("FunctionNamesAreTold", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook))
		for key, want := range map[string]bool{
			"main.main.func1":                    true,
			"main.report":                        true,
			"github.com/acme/billing.report":     true,
			"github.com/acme/billing.(*Job).Run": true,
			"github.com/acme/billing.Job.Run-fm": true,
			"svc.handler.func2.1":                true,
			"nightly-report":                     false,
			"billing.invoice":                    false,
			"send reminders":                     false,
			"reports/2024.csv":                   false,
			"v1.2.3":                             false,
		} {
			lock, err := l.Lock(ctx, key)
			require.NoError(t, err, key)
			require.NoError(t, lock.Unlock(ctx))
			warned := false
			for _, ev := range events.All() {
				warned = warned || ev.Kind == pglease.EventUnnamedJob && ev.Key == key
			}
			assert.Equal(t, want, warned, "%q taken for a function name", key)
		}
	})
}

// onGrid reports whether t is a multiple of period since the Unix epoch.
func onGrid(t time.Time, period time.Duration) bool {
	return t.UnixNano()%int64(period) == 0
}

// gridScheduler is a scheduler without a Locker, shut down at cleanup.
func gridScheduler(t *testing.T) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// TestStartOnGrid pins StartOnGrid: runs fall on the multiples of the
// period since the Unix epoch, whenever each scheduler started.
func TestStartOnGrid(t *testing.T) {
	t.Parallel()
	// Guarantee: StartOnGrid schedules the next multiples of the period since
	// the Unix epoch.
	t.Run("NextMultiplesSinceTheEpoch", func(t *testing.T) {
		t.Parallel()
		for _, period := range []time.Duration{time.Second, 7 * time.Second, time.Minute, 90 * time.Minute, 24 * time.Hour} {
			for _, started := range []bool{false, true} { // job added before Start, or to a running scheduler
				s := gridScheduler(t)
				if started {
					s.Start()
				}
				before := time.Now()
				j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {}), pglease.StartOnGrid(period))
				require.NoError(t, err)
				s.Start()
				after := time.Now()
				next, err := j.NextRuns(3)
				require.NoError(t, err)
				require.Len(t, next, 3)
				assert.True(t, onGrid(next[0], period), "period %v: first run %v is on the grid", period, next[0])
				assert.False(t, next[0].Before(before), "period %v: first run %v is not in the past (%v)", period, next[0], before)
				assert.True(t, next[0].Before(after.Add(period)), "period %v: first run %v is the next multiple after %v", period, next[0], after)
				assert.Equal(t, period, next[1].Sub(next[0]), "period %v", period)
				assert.Equal(t, period, next[2].Sub(next[1]), "period %v", period)
			}
		}
	})

	// Guarantee: StartOnGrid puts minutes on second zero and days on midnight
	// UTC.
	t.Run("MinutesOnSecondZeroDaysOnMidnight", func(t *testing.T) {
		t.Parallel()
		for period, want := range map[time.Duration]func(time.Time) bool{
			time.Minute:      func(at time.Time) bool { return at.UTC().Second() == 0 && at.Nanosecond() == 0 },
			10 * time.Second: func(at time.Time) bool { return at.UTC().Second()%10 == 0 && at.Nanosecond() == 0 },
			24 * time.Hour: func(at time.Time) bool {
				u := at.UTC()
				return u.Hour() == 0 && u.Minute() == 0 && u.Second() == 0 && u.Nanosecond() == 0
			},
		} {
			s := gridScheduler(t)
			j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {}), pglease.StartOnGrid(period))
			require.NoError(t, err)
			s.Start()
			next, err := j.NextRun()
			require.NoError(t, err)
			assert.True(t, want(next), "period %v: first run %v", period, next.UTC())
		}
	})

	// A replica's scheduler may start long after its job was added (a slow
	// start-up): its first run is then the next multiple after the start, and
	// no run is made for the multiples that passed meanwhile.
	t.Run("LateStartRunsFirstAtTheNextMultiple", func(t *testing.T) {
		t.Parallel()
		const period = 40 * time.Millisecond
		s := gridScheduler(t)
		runs := make(chan time.Time, 10)
		j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() { runs <- time.Now() }), pglease.StartOnGrid(period))
		require.NoError(t, err)
		time.Sleep(3 * period) // three multiples pass before the scheduler starts
		started := time.Now()
		s.Start()
		next, err := j.NextRun()
		require.NoError(t, err)
		assert.True(t, onGrid(next, period), "first run %v is on the grid", next)
		assert.False(t, next.Before(started), "first run %v is not one that passed before the start (%v)", next, started)
		assert.True(t, next.Before(started.Add(period)), "first run %v is the next multiple after the start (%v)", next, started)
		select {
		case at := <-runs:
			assert.False(t, at.Before(next), "the first run (%v) waited for its multiple (%v)", at, next)
		case <-time.After(10 * period):
			t.Fatal("the job never ran")
		}
	})

	// Schedulers started at different moments, as replicas are, run the job at
	// the same instants: the grid's, not each one's start plus whole periods.
	t.Run("SchedulersStartedApartRunTogether", func(t *testing.T) {
		t.Parallel()
		const period = 200 * time.Millisecond
		type run struct {
			replica int
			at      time.Time
		}
		runs := make(chan run, 100)
		var nexts []time.Time
		for i, wait := range []time.Duration{0, period / 3, period * 5 / 4} {
			time.Sleep(wait) // the moment this replica starts, off the grid
			s := gridScheduler(t)
			j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() { runs <- run{i, time.Now()} }), pglease.StartOnGrid(period))
			require.NoError(t, err)
			s.Start()
			next, err := j.NextRun()
			require.NoError(t, err)
			nexts = append(nexts, next)
		}
		for i, next := range nexts {
			assert.True(t, onGrid(next, period), "replica %d: first run %v on the grid", i, next)
		}
		// Each replica fires shortly after a multiple of the period (its
		// timer's latency), far from the middle between two multiples.
		for range 6 {
			select {
			case r := <-runs:
				late := time.Duration(r.at.UnixNano() % int64(period))
				assert.Less(t, late, period/2, "replica %d ran %v after a multiple of the period", r.replica, late)
			case <-time.After(5 * period):
				t.Fatal("the replicas stopped running")
			}
		}
	})

	// Guarantee: StartOnGrid refuses a period that is not positive.
	t.Run("RefusesANonPositivePeriod", func(t *testing.T) {
		t.Parallel()
		for _, period := range []time.Duration{0, -time.Second} {
			func() {
				defer func() {
					err, ok := recover().(error)
					require.True(t, ok, "StartOnGrid(%v) panics with an error", period)
					require.ErrorIs(t, err, pglease.ErrInvalidOption)
					var oe *pglease.OptionError
					require.ErrorAs(t, err, &oe)
					assert.Equal(t, "StartOnGrid", oe.Option)
					assert.Contains(t, err.Error(), "must be positive")
				}()
				pglease.StartOnGrid(period)
			}()
		}
	})
}
