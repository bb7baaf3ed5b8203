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

// runScheduler runs this replica's jobs until ctx ends. Every replica of
// the service runs it, started whenever the replica starts, and each tick
// of "send-invoices" runs on exactly one of them.
func runScheduler(ctx context.Context, pool *pgxpool.Pool, every time.Duration,
	sendInvoices func(ctx context.Context, fence int64) error) error {
	locker := pglease.NewLocker(pool,
		pglease.WithTTL(30*time.Second), // a crashed replica's jobs wait this long
	)
	defer locker.Close(ctx) // after s.Shutdown(): releases what is held

	// Each tick of the period's grid runs at most once, judged on the
	// database's clock: no min hold, any run time.
	invoices, err := locker.Job(pglease.WithPeriod(every))
	if err != nil {
		return err
	}
	s, err := gocron.NewScheduler()
	if err != nil {
		return err
	}
	// The job's name, given once: its gocron name and its lease's key.
	// The run gets its lease, and a context that ends the moment the
	// lease is lost (or s.Shutdown cancels the run); its error goes to
	// gocron and marks the run failed in the ledger.
	task, named := locker.Task("send-invoices", func(ctx context.Context, lease *pglease.Lease) error {
		return sendInvoices(ctx, lease.Fence())
	})
	_, err = invoices.Schedule(s, task, named)
	if err != nil {
		return errors.Join(err, s.Shutdown())
	}
	s.Start()
	<-ctx.Done()
	return s.Shutdown()
}

// Wire a gocron scheduler to pglease: every replica runs the same code, and
// each tick of "send-invoices" runs on one of them. Locker.Task hands each
// run its lease.
func Example_scheduler() {
	ctx, stop := context.WithCancel(context.Background()) // a service: signal.NotifyContext
	defer stop()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool); err != nil { // or apply pglease.Schema() with your migration tool
		panic(err)
	}
	// A service runs it every minute until SIGTERM; this example, every
	// second until the first run.
	err = runScheduler(ctx, pool, time.Second, func(ctx context.Context, fence int64) error {
		defer stop()
		return sendInvoices(ctx, fence)
	})
	if err != nil {
		panic(err)
	}
	// Output: invoices sent on one replica, fenced: true
}

// Run a job every 10 seconds at the same instants on every replica,
// whenever each replica started: at the multiples of 10s since the Unix
// epoch, so :00, :10, :20 ... of every minute.
func ExampleStartOnGrid() {
	s, err := gocron.NewScheduler() // with gocron.WithDistributedLocker(locker)
	if err != nil {
		panic(err)
	}
	defer func() { _ = s.Shutdown() }()
	j, err := s.NewJob(gocron.DurationJob(10*time.Second),
		gocron.NewTask(func() {}),
		gocron.WithName("refresh-rates"),
		pglease.StartOnGrid(10*time.Second),
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	next, err := j.NextRuns(2)
	if err != nil {
		panic(err)
	}
	fmt.Println("first run on a round 10s:", next[0].Second()%10 == 0 && next[0].Nanosecond() == 0)
	fmt.Println("then every", next[1].Sub(next[0]))
	// Output:
	// first run on a round 10s: true
	// then every 10s
}

// sendInvoices stands for a job's work.
func sendInvoices(ctx context.Context, fence int64) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	fmt.Println("invoices sent on one replica, fenced:", fence > 0)
	return nil
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
