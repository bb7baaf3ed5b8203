package pglease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// Give one job its own TTL and min hold: a nightly report and a job every
// 10 seconds share one Locker, its pool, its heartbeat goroutine and one
// heartbeat statement per round.
func ExampleLocker_Job() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_jobs")); err != nil {
		panic(err)
	}

	// The Locker's terms suit the frequent jobs: a 30s TTL, a 5s min hold.
	locker := pglease.NewLocker(pool, pglease.WithTable("example_jobs"),
		pglease.WithTTL(30*time.Second), pglease.WithMinHold(5*time.Second))
	defer locker.Close(ctx) // releases the leases of every job

	// The nightly report fails over after 10 minutes and keeps its tick for
	// an hour after it returns.
	_, err = locker.Job(pglease.WithTTL(10*time.Minute), pglease.WithMinHold(time.Hour))
	fmt.Println("refused:", err)
	nightly, err := locker.Job(pglease.WithTTL(2*time.Hour), pglease.WithMinHold(time.Hour))
	if err != nil {
		panic(err)
	}

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker)) // every other job
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	_, err = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), // e.g. gocron.DailyJob
		gocron.NewTask(func() {
			defer close(done)
			lease, _ := locker.Held("nightly-report") // a job's lease is the Locker's
			fmt.Println("nightly report, fenced:", lease.Fence() > 0)
		}),
		gocron.WithName("nightly-report"),
		gocron.WithDistributedJobLocker(nightly), // its own TTL and min hold
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	<-done
	_ = s.Shutdown()
	// Output:
	// refused: pglease: Job: WithMinHold(1h0m0s): must not exceed the job's TTL (10m0s)
	// nightly report, fenced: true
}

// Name a job once: Task gives gocron the job's name and hands the run the
// lease claimed on that name, with a context that ends with the lease. A
// job left without a name would get the Go function's name, which changes
// when the code moves (Lock reports such a key as EventUnnamedJob).
func ExampleLocker_Task() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_task")); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_task"))
	defer locker.Close(ctx)

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	done := make(chan struct{})
	task, named := locker.Task("send-invoices", func(ctx context.Context, lease *pglease.Lease) error {
		defer close(done)
		return sendInvoices(ctx, lease.Fence()) // ctx ends the moment the lease is lost
	})
	if _, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, named); err != nil {
		panic(err)
	}
	s.Start()
	<-done
	_ = s.Shutdown()
	// Output: invoices sent on one replica, fenced: true
}
