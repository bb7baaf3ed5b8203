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
		task, named := l.Task("nightly-report", func(ctx context.Context, lease *pglease.Lease) {
			held, ok := l.Held("nightly-report")
			ran <- seen{key: lease.Key(), fence: lease.Fence(), live: ctx.Err() == nil, runCtx: ctx, onHeld: ok && held == lease}
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
		task, named := l.Task("long-run", func(ctx context.Context, lease *pglease.Lease) {
			started <- lease
			<-ctx.Done()
			ended <- context.Cause(ctx)
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

	t.Run("RefusesABadName", func(t *testing.T) {
		t.Parallel()
		l := pgtest.Each(pglease.NewLocker(pgtest.Pool(t, nil)))
		assert.Contains(t, panicMessage(func() { l.Task("", func(context.Context, *pglease.Lease) {}) }), "key is empty")
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
