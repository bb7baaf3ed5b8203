package pglease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// A migration runner or a singleton worker waits for its key rather than
// giving up on ErrHeld: ClaimWait returns once this replica holds it, woken
// by the holder's release (or its expiry), or when ctx ends.
func ExampleLocker_ClaimWait() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool)
	defer locker.Close(ctx)

	wait, cancel := context.WithTimeout(ctx, 10*time.Minute) // the longest this replica waits
	defer cancel()
	lease, err := locker.ClaimWait(wait, "schema-migrations")
	if err != nil {
		panic(err) // wraps ctx.Err(), and ErrHeld if the key was still held
	}
	defer func() { _ = lease.Unlock(ctx) }()
	fmt.Println("migrating under fence > 0:", lease.Fence() > 0)
	// Output: migrating under fence > 0: true
}
