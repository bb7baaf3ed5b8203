package faults_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// syncOffScope turns synchronous_commit off for the connections a pool opens
// from now on, at one level of PostgreSQL's settings, and says how to undo it.
type syncOffScope struct {
	name    string
	set     []string // run as the server's superuser
	reset   []string
	runtime bool // set it as a connection parameter instead
}

var syncOffScopes = []syncOffScope{
	{name: "session", runtime: true},
	{name: "role",
		set:   []string{`DO $$ BEGIN EXECUTE format('ALTER ROLE %I SET synchronous_commit = off', current_user); END $$`},
		reset: []string{`DO $$ BEGIN EXECUTE format('ALTER ROLE %I RESET synchronous_commit', current_user); END $$`}},
	{name: "database",
		set:   []string{`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`},
		reset: []string{`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET synchronous_commit', current_database()); END $$`}},
	{name: "server",
		set:   []string{`ALTER SYSTEM SET synchronous_commit = off`, `SELECT pg_reload_conf()`},
		reset: []string{`ALTER SYSTEM RESET synchronous_commit`, `SELECT pg_reload_conf()`}},
}

// exec runs statements on a connection of its own.
func exec(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range stmts {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, "%s", s)
	}
}

// syncOffPool opens a pool whose sessions run with synchronous_commit off
// because of scope, and checks that they do.
func syncOffPool(t *testing.T, dsn string, scope syncOffScope) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.PoolWith(t, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		if scope.runtime {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		}
	})
	// A reload reaches every backend soon, not at once: wait until a new
	// session sees it.
	require.Eventually(t, func() bool {
		conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var got string
		require.NoError(t, conn.QueryRow(context.Background(), `SHOW synchronous_commit`).Scan(&got))
		return got == "off"
	}, 10*time.Second, 20*time.Millisecond, "sessions never saw synchronous_commit = off set at the %s level", scope.name)
	return pool
}

// durableTable creates a migrated lease table and checkpoints, so that the
// table itself survives the crash whatever the sessions' settings.
func durableTable(t *testing.T, srv *pgserver.Server) string {
	t.Helper()
	table := pgtest.TableName()
	ctx := pgtest.Ctx(t)
	conn, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(t, err)
	defer conn.Close(ctx)
	require.NoError(t, pglease.Migrate(ctx, conn, pglease.WithTable(table)))
	_, err = conn.Exec(ctx, `CHECKPOINT`)
	require.NoError(t, err)
	return table
}

// crashAndRestart kills the server without a checkpoint and starts it again.
func crashAndRestart(t *testing.T, srv *pgserver.Server) {
	t.Helper()
	require.NoError(t, srv.Stop(pgserver.Immediate))
	require.NoError(t, srv.Start(pgtest.Ctx(t)))
}
