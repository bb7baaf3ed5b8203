// Package pglease runs a job scheduled on several replicas on exactly one of
// them, and gives each run a fencing token that only grows. It is a lease
// table in PostgreSQL and a [Locker] that plugs into gocron v2
// (gocron.WithDistributedLocker).
//
// Every replica runs the same code, started whenever the replica starts. The
// running job gets its lease from [Locker.Task], works under
// [Lease.Context], which ends the moment the lease is lost, and passes
// [Lease.Fence] to what it writes:
//
//	// runScheduler runs this replica's jobs until ctx ends. Every replica of
//	// the service runs it, started whenever the replica starts, and each tick
//	// of "send-invoices" runs on exactly one of them.
//	func runScheduler(ctx context.Context, pool *pgxpool.Pool, every time.Duration,
//		sendInvoices func(ctx context.Context, fence int64) error) error {
//		locker := pglease.NewLocker(pool,
//			pglease.WithTTL(30*time.Second), // a crashed replica's jobs wait this long
//		)
//		defer locker.Close(ctx) // after s.Shutdown(): releases what is held
//
//		// Each tick of the period's grid runs at most once, judged on the
//		// database's clock: no min hold, any run time.
//		invoices, err := locker.Job(pglease.WithPeriod(every))
//		if err != nil {
//			return err
//		}
//		s, err := gocron.NewScheduler()
//		if err != nil {
//			return err
//		}
//		// The job's name, given once: its gocron name and its lease's key.
//		// The run gets its lease, and a context that ends the moment the
//		// lease is lost (or s.Shutdown cancels the run); its error goes to
//		// gocron and marks the run failed in the ledger.
//		task, named := locker.Task("send-invoices", func(ctx context.Context, lease *pglease.Lease) error {
//			return sendInvoices(ctx, lease.Fence())
//		})
//		_, err = invoices.Schedule(s, task, named)
//		if err != nil {
//			return errors.Join(err, s.Shutdown())
//		}
//		s.Start()
//		<-ctx.Done()
//		return s.Shutdown()
//	}
//
// Each claim takes the tick of the job's period nearest the database's
// clock ([WithPeriod]), so a tick runs at most once however late a
// replica's timer fires. [Migrate] creates the table. Outside gocron,
// [Locker.Claim] takes a key and [Locker.ClaimWait] waits for one; an
// [Elector] runs all of a service's jobs on one leader.
//
// # Guarantees
//
//   - One lease per key at a time, as the database judges it; the holder
//     stops trusting its lease before the database lets anyone else in.
//   - Fences only grow per key, across holders, restarts and purges: a store
//     that refuses a lower fence, or a transaction that calls [Lease.Guard]
//     before its commit, refuses a replica that lost its lease.
//   - A lost lease stays lost, and is reported: its context ends with a
//     cause wrapping [ErrLost], and the Locker logs it and calls its hooks.
//
// These rest on a replica's clock not running slow by more than a tenth of
// the TTL (at most a second) over one TTL, on a durable server, and across a
// failover on a synchronous standby. Fencing protects only what checks the
// fence. The [user guide] says why and how to choose TTL and heartbeat;
// [Operations] covers the schema, grants, PgBouncer and metrics.
//
// [user guide]: https://github.com/pglease/pglease/blob/main/docs/GUIDE.md
// [Operations]: https://github.com/pglease/pglease/blob/main/docs/OPERATIONS.md
package pglease
