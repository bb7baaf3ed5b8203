package pglease_test

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// From inside the service, with no round trip: the leases this Locker holds
// now, how sure it is of each, and how far the database's clock is from
// this replica's.
func ExampleLocker_Leases() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_leases")); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_leases"), pglease.WithMinHold(time.Second))
	defer locker.Close(ctx)
	if _, err := locker.Claim(ctx, "nightly"); err != nil {
		panic(err)
	}

	for _, l := range locker.Leases() { // a sorted copy
		trusted := time.Until(l.TrustUntil) // local time: believed until then unless a heartbeat gets through
		fmt.Println(l.Key, l.Fence > 0, l.State, trusted > 0)
	}
	if s, ok := locker.ClockSkew(); ok { // the database's clock minus this replica's
		fmt.Println("skew within a second:", (s.Offset-s.Uncertainty).Abs() < time.Second)
	}
	// Output:
	// nightly true confirmed true
	// skew within a second: true
}

// The whole table, whoever holds it: the admin API that the operator
// command runs. Remaining time is reckoned on the server's clock.
func ExampleAdmin() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	table := pglease.WithTable("example_admin")
	if err := pglease.Migrate(ctx, pool, table); err != nil {
		panic(err)
	}
	replica := pglease.NewLocker(pool, table, pglease.WithHolder("replica-a"), // a replica holding two leases
		pglease.WithLogger(slog.New(slog.DiscardHandler)))
	defer replica.Close(ctx)
	for _, key := range []string{"nightly", "weekly"} {
		if _, err := replica.Claim(ctx, key); err != nil {
			panic(err)
		}
	}

	admin, err := pglease.NewAdmin(pool, table) // the operator's view of one table
	if err != nil {
		panic(err)
	}
	rows, err := admin.List(ctx) // every row, live and expired, sorted by key
	if err != nil {
		panic(err)
	}
	for _, r := range rows { // r.ServerNow: the server's clock at the reading
		// r.Holder: WithHolder's value, '#', the Locker's own suffix
		name, _, _ := strings.Cut(r.Holder, "#")
		fmt.Println(r.Key, name, r.Fence > 0, r.Live, r.ExpiresAt.Sub(r.ServerNow).Round(time.Minute)) // time left
	}
	n, err := admin.Purge(ctx, 24*time.Hour) // at least an hour, else an error that says why
	if err != nil {
		panic(err)
	}
	fmt.Println("purged", n)
	rev, err := admin.Revoke(ctx, "nightly") // as `pglease release`: holder "pglease:revoked", expiry kept
	if err != nil {
		panic(err)
	}
	fmt.Println(rev.Changed, rev.Row.Holder == replica.Holder())
	rev, err = admin.ForceExpire(ctx, "weekly") // as `release -now`: UNSAFE, claimable at once
	if err != nil {
		panic(err)
	}
	fmt.Println(rev.Changed, rev.Row.Holder == replica.Holder())
	// Output:
	// nightly replica-a true true 1m0s
	// weekly replica-a true true 1m0s
	// purged 0
	// true true
	// true true
}
