package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// The DDL Migrate runs, for a migration tool (goose, golang-migrate, atlas)
// when the service may not run DDL itself. For the default table it is
// schema.sql, less its comment.
func ExampleSchema() {
	ddl, err := pglease.Schema(pglease.WithTable("jobs.lease")) // the schema "jobs" must exist
	if err != nil {
		panic(err)
	}
	fmt.Print(ddl)
	// Output:
	// CREATE SEQUENCE IF NOT EXISTS "jobs"."lease_fence_seq" AS bigint;
	// CREATE TABLE IF NOT EXISTS "jobs"."lease" (
	//     key         text        PRIMARY KEY,
	//     holder      text        NOT NULL,
	//     fence       bigint      NOT NULL DEFAULT nextval('"jobs"."lease_fence_seq"'),
	//     acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	//     expires_at  timestamptz NOT NULL,
	//     tick        timestamptz,
	//     released_at timestamptz,
	//     CHECK (expires_at > acquired_at)
	// );
	// CREATE TABLE IF NOT EXISTS "jobs"."lease_run" (
	//     fence      bigint      NOT NULL,
	//     key        text        NOT NULL,
	//     tick       timestamptz NOT NULL,
	//     holder     text        NOT NULL,
	//     started_at timestamptz NOT NULL,
	//     ended_at   timestamptz,
	//     outcome    text,
	//     PRIMARY KEY (fence, tick)
	// );
	// CREATE INDEX IF NOT EXISTS "lease_run_key" ON "jobs"."lease_run" (key, started_at);
}

// Work on a lease table an older library created, as it is: no fence
// column, no ALTER, old and new replicas excluding each other during a
// rolling deploy.
func ExampleWithoutFenceColumn() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	// The existing table (here created for the example).
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS job_locks
		(key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)`); err != nil {
		panic(err)
	}

	locker := pglease.NewLocker(pool, pglease.WithTable("job_locks"), pglease.WithoutFenceColumn())
	defer locker.Close(ctx)
	lease, err := locker.Claim(ctx, "nightly") // checks the table's shape at the first claim
	if err != nil {
		panic(err)
	}
	fmt.Println("fence:", lease.Fence())                                                  // no order between leases
	fmt.Println("forged holder:", strings.HasPrefix(lease.Holder(), locker.Holder()+"#")) // one per lease
	// Output:
	// fence: 0
	// forged holder: true
}

// Behind PgBouncer (or another pooler) in transaction pooling mode: every
// statement of pglease then goes in one round trip.
func ExampleNewLocker_transactionPooler() {
	ctx := context.Background()
	cfg, err := pgxpool.ParseConfig(databaseURL()) // the pooler's address
	if err != nil {
		panic(err)
	}
	cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		panic(err)
	}
	defer pool.Close()

	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_pooler")); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_pooler"))
	defer locker.Close(ctx)
	lease, err := locker.Claim(ctx, "nightly")
	if err != nil {
		panic(err)
	}
	fmt.Println("fenced:", lease.Fence() > 0)
	// Output: fenced: true
}

// Options read from configuration: NewLocker panics with an error wrapping
// ErrInvalidOption that names the option, which a service may recover to
// report.
func ExampleNewLocker_optionsFromConfiguration() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	ttl, heartbeat := 10*time.Second, 5*time.Second // say, from the environment

	newLocker := func(opts ...pglease.Option) (l *pglease.Locker, err error) {
		defer func() {
			if r := recover(); r != nil {
				err = r.(error) // NewLocker panics with an error
			}
		}()
		return pglease.NewLocker(pool, opts...), nil
	}

	_, err = newLocker(pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(heartbeat))
	if errors.Is(err, pglease.ErrInvalidOption) {
		fmt.Println("refused:", err)
	}
	locker, err := newLocker(pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(heartbeat/2))
	if err != nil {
		panic(err)
	}
	defer locker.Close(ctx)
	fmt.Println("heartbeat every", heartbeat/2, "for a TTL of", ttl)
	// Output:
	// refused: pglease: WithHeartbeatInterval(5s): must be less than TTL/2 (TTL is 10s)
	// heartbeat every 2.5s for a TTL of 10s
}
