package pglease_test

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// A job that writes to the database holding the lease table: do the writes,
// call Guard last, commit. The commit then happens only while the lease is
// current, whatever pauses the process went through, and the job's SQL does
// not need to know about fences.
func ExampleLease_Guard() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_guard")); err != nil {
		panic(err)
	}
	if _, err := pool.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_report (day date PRIMARY KEY, total bigint NOT NULL)`); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_guard"))
	defer locker.Close(ctx)

	lease, err := locker.Claim(ctx, "daily-report")
	if err != nil {
		panic(err)
	}
	// pgx.BeginFunc commits when the function returns nil, and rolls back
	// otherwise.
	err = pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO example_report VALUES ('2024-01-31', 42)
			ON CONFLICT (day) DO UPDATE SET total = EXCLUDED.total`); err != nil {
			return err
		}
		// Last, right before the commit: it locks the lease row until the
		// transaction ends, which holds back claims and this row's heartbeat.
		return lease.Guard(ctx, tx)
	})
	switch {
	case errors.Is(err, pglease.ErrLost):
		fmt.Println("lease lost: nothing was written")
	case err != nil:
		panic(err)
	default:
		fmt.Println("report written under fence", lease.Fence() > 0)
	}
	// Output: report written under fence true
}

// A store outside the lease's database cannot be fenced by Guard. Store the
// fence with each write there, and let the store refuse a write that
// carries a lower fence than the one it holds: here a conditional UPSERT in
// another SQL database (played by the same server). An object store does
// the same with a conditional put: read the object and its version, refuse
// if its fence is greater, write with If-Match on that version (S3 ETag,
// GCS ifGenerationMatch), and start over if the version changed.
func ExampleLease_Fence() {
	ctx := context.Background()
	other, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer other.Close()
	if _, err := other.Exec(ctx, `CREATE TABLE IF NOT EXISTS example_index_state
		(name text PRIMARY KEY, state text NOT NULL, fence bigint NOT NULL)`); err != nil {
		panic(err)
	}

	// fencedPut writes state unless a write with a greater fence got there
	// first. Equal fences are the same lease writing again.
	const fencedPut = `INSERT INTO example_index_state AS s (name, state, fence) VALUES ($1, $2, $3)
		ON CONFLICT (name) DO UPDATE SET state = EXCLUDED.state, fence = EXCLUDED.fence
		 WHERE s.fence <= EXCLUDED.fence`
	put := func(state string, fence int64) {
		tag, err := other.Exec(ctx, fencedPut, "search", state, fence)
		if err != nil {
			panic(err)
		}
		if tag.RowsAffected() == 0 {
			fmt.Printf("fence %d refused: a later lease wrote already\n", fence)
			return
		}
		fmt.Printf("fence %d wrote %q\n", fence, state)
	}
	// With a lease: put(state, lease.Fence()). Two leases, the older one
	// paused and waking up late:
	put("rebuilt under fence 8", 8)
	put("rebuilt under fence 7", 7)
	// Output:
	// fence 8 wrote "rebuilt under fence 8"
	// fence 7 refused: a later lease wrote already
}
