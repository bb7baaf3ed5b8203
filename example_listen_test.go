package pglease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// serverURL is the server's own address, past the pooler.
func serverURL() string { return pgtest.Server.DSN() }

// Behind PgBouncer in transaction mode, the Locker's statements go
// through the pooler and its waiting claims listen on a direct
// connection of their own.
func ExampleWithListenDSN() {
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
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_listen")); err != nil {
		panic(err)
	}

	locker := pglease.NewLocker(pool, pglease.WithTable("example_listen"),
		pglease.WithListenDSN(serverURL())) // LISTEN only, past the pooler
	defer locker.Close(ctx)
	wait, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	lease, err := locker.ClaimWait(wait, "reindex") // woken by the release's notification
	if err != nil {
		panic(err)
	}
	defer func() { _ = lease.Unlock(ctx) }()
	fmt.Println("fenced:", lease.Fence() > 0)
	// Output: fenced: true
}
