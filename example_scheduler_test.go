package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"log"
	"log/slog"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// databaseURL stands for your service's connection string.
func databaseURL() string { return pgtest.Server.DSN() }

// Wire a gocron scheduler to pglease: every replica runs the same code, and
// each tick of "send-invoices" runs on one of them. Inside the job, the
// lease of the run is locker.Held(jobName).
func Example_scheduler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool); err != nil {
		panic(err)
	}

	locker := pglease.NewLocker(pool,
		pglease.WithTTL(30*time.Second),
		pglease.WithMinHold(30*time.Second), // half the job period: see below
	)
	defer locker.Close(ctx) // after s.Shutdown(): releases what is held

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	sent := make(chan struct{})
	_, err = s.NewJob(gocron.DurationJob(time.Minute),
		gocron.NewTask(func(ctx context.Context) { // gocron passes the job's context
			lease, ok := locker.Held("send-invoices")
			if !ok {
				return
			}
			ctx, cancel := lease.Context(ctx) // ends the moment the lease is lost
			defer cancel()
			sendInvoices(ctx, lease.Fence())
			close(sent)
		}),
		gocron.WithName("send-invoices"), // the lease key: always name jobs
		gocron.WithStartAt(gocron.WithStartImmediately()),
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	<-sent // the example stops after one run
	_ = s.Shutdown()
	// Output: invoices sent on one replica, fenced: true
}

// sendInvoices stands for a job's work.
func sendInvoices(ctx context.Context, fence int64) {
	if ctx.Err() == nil {
		fmt.Println("invoices sent on one replica, fenced:", fence > 0)
	}
}

// gocron's own signal of a skipped run: a Lock error fires the job's
// AfterLockError listener. Contention is one too, and normal: filter it.
func Example_afterLockError() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_lock_error")); err != nil {
		panic(err)
	}
	other := pglease.NewLocker(pool, pglease.WithTable("example_lock_error")) // another replica
	defer other.Close(ctx)
	if _, err := other.Claim(ctx, "send-reminders"); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_lock_error"))
	defer locker.Close(ctx)

	s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	if err != nil {
		panic(err)
	}
	skipped := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() { fmt.Println("not this replica's tick") }),
		gocron.WithName("send-reminders"),
		gocron.WithEventListeners(gocron.AfterLockError(func(_ uuid.UUID, name string, err error) {
			defer close(skipped)
			if errors.Is(err, pglease.ErrHeld) {
				fmt.Println(name, "runs on another replica this tick")
				return // normal
			}
			alert(name, err) // pglease has logged it at error level already
		})),
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	<-skipped
	_ = s.Shutdown()
	// Output: send-reminders runs on another replica this tick
}

// alert stands for the application's alerting.
func alert(job string, err error) { log.Printf("job %s skipped: %v", job, err) }

// Inside a job, reach the lease by the job's name: pass its fence to every
// downstream write, and work under its context, which ends the moment the
// lease is lost.
func ExampleLocker_Held() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, databaseURL())
	defer pool.Close()
	_ = pglease.Migrate(ctx, pool, pglease.WithTable("example_held"))
	locker := pglease.NewLocker(pool, pglease.WithTable("example_held"))
	defer locker.Close(ctx)

	s, _ := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
	done := make(chan struct{})
	_, _ = s.NewJob(
		gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func(ctx context.Context) { // gocron passes the job's context
			defer close(done)
			lease, ok := locker.Held("rebuild-index")
			if !ok {
				return
			}
			ctx, cancel := lease.Context(ctx)
			defer cancel()
			// e.g. UPDATE index_state SET ..., fence = $1 WHERE fence < $1
			fmt.Println("fenced:", lease.Fence() > 0, "valid:", ctx.Err() == nil)
		}),
		gocron.WithName("rebuild-index"),
	)
	s.Start()
	<-done
	_ = s.Shutdown()
	// Output: fenced: true valid: true
}

// Report lost leases to the application: gocron never sees them, and ignores
// what Unlock returns.
func ExampleWithHook() {
	ctx := context.Background()
	pool, _ := pgxpool.New(ctx, databaseURL())
	defer pool.Close()
	_ = pglease.Migrate(ctx, pool, pglease.WithTable("example_hook"))

	lost := make(chan struct{})
	locker := pglease.NewLocker(pool,
		pglease.WithTable("example_hook"),
		pglease.WithTTL(time.Second),
		pglease.WithLogger(slog.New(slog.DiscardHandler)), // the hook reports instead
		pglease.WithHook(func(e pglease.Event) {
			if e.Kind == pglease.EventLost {
				fmt.Printf("%s: lease on %q lost: %v\n", e.Kind, e.Key, errors.Is(e.Err, pglease.ErrLost))
				close(lost)
			}
		}),
	)
	defer locker.Close(ctx)

	lease, _ := locker.Claim(ctx, "reindex")
	// Someone takes the row behind the locker's back (an operator, a bug):
	_, _ = pool.Exec(ctx, `UPDATE example_hook SET holder = 'operator' WHERE key = 'reindex'`)
	<-lost
	fmt.Println("unlock:", lease.Unlock(ctx) != nil)
	// Output:
	// lost: lease on "reindex" lost: true
	// unlock: true
}
