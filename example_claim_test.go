package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// Without a scheduler: claim a key, work under the lease's context, pass its
// fence downstream, unlock. Every replica runs the same code; one of them
// gets the lease, the others get ErrHeld.
func ExampleLocker_Claim() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool); err != nil { // or apply pglease.Schema() with your migration tool
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTTL(30*time.Second))
	defer locker.Close(ctx) // stops the heartbeat, releases what is held

	lease, err := locker.Claim(ctx, "nightly-report")
	switch {
	case errors.Is(err, pglease.ErrHeld):
		return // another replica has it: normal
	case err != nil:
		panic(err)
	}
	defer func() { _ = lease.Unlock(ctx) }() // a failure is logged and hooked already
	jobCtx, cancel := lease.Context(ctx)     // cancelled the moment the lease is lost
	defer cancel()
	writeReport(jobCtx, lease.Fence()) // the downstream rejects older fences
	// Output: report written under a fence: true
}

// writeReport stands for a job's work: it stores fence with what it writes.
func writeReport(ctx context.Context, fence int64) {
	if ctx.Err() == nil {
		fmt.Println("report written under a fence:", fence > 0)
	}
}
