package pglease_test

import (
	"context"
	"fmt"
	"log"
	"os"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// The README's "Seeing what a replica holds", compiled (not run: it needs
// a database).
func ExampleList() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Print(err)
		return
	}
	defer pool.Close()

	rows, err := pglease.List(ctx, pool) // every row, live and expired, sorted by key
	if err != nil {
		log.Print(err)
		return
	}
	for _, r := range rows { // r.ServerNow: the server's clock at the reading
		fmt.Println(r.Key, r.Holder, r.Fence, r.Live, r.ExpiresIn())
	}
	if _, err := pglease.Purge(ctx, pool, 24*time.Hour); err != nil { // at least MinRetention
		log.Print(err)
	}
	rev, err := pglease.Revoke(ctx, pool, "nightly") // as `pglease release`
	if err != nil {
		log.Print(err)
		return
	}
	fmt.Println(rev.Changed, rev.Row.Holder)
}

func ExampleLocker_ClockSkew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Print(err)
		return
	}
	defer pool.Close()
	locker := pglease.NewLocker(pool, pglease.WithMinHold(time.Second))
	defer func() { _ = locker.Close(ctx) }()

	if _, err := locker.Claim(ctx, "nightly"); err != nil {
		log.Print(err)
		return
	}
	for _, l := range locker.Leases() {
		fmt.Println(l.Key, l.Fence, l.State, time.Until(l.TrustUntil))
	}
	if s, ok := locker.ClockSkew(); ok {
		fmt.Printf("database clock ahead by %v ± %v\n", s.Offset, s.Uncertainty)
	}
}
