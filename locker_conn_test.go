package pglease_test

import (
	"errors"
	"net"
	"strconv"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// closedPort is a port of 127.0.0.1 nothing listens on: it was free a
// moment ago, and connecting to it is refused.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

// TestConns is about the connections a Locker's statements run on, and how
// their failures read.
func TestConns(t *testing.T) {
	t.Parallel()

	t.Run("PreparedStatementErrorsBehindPgBouncerNameTheExecModeFix", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		// One server connection: every client connection's statements land
		// on it, so the second client to prepare pgx's cached statement
		// finds it prepared already by the first. It needs a PgBouncer
		// that does not track prepared statements: before 1.21 none does,
		// and from 1.22 on max_prepared_statements (200 by default) must
		// be set to 0 in its configuration.
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 1})
		table := pgtest.Table(t, pgtest.Pool(t, nil)) // created beside the pooler, not through it
		defaultMode := func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeCacheStatement // pgx's default
			cfg.MaxConns = 2
		}
		var logged lockedBuffer
		first := pgtest.Locker(t, pgtest.PoolWith(t, b.DSN(), defaultMode), table, "first")
		second := pgtest.Locker(t, pgtest.PoolWith(t, b.DSN(), defaultMode), table, "second",
			pglease.WithLogger(jsonLogger(&logged)))

		lease, err := first.Claim(ctx, "first-key")
		require.NoError(t, err, "the first client prepares the statement")
		_, err = second.Claim(ctx, "second-key")
		require.Error(t, err, "the second client's statement collides with the first's on the one server connection")
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the server's error stays wrapped")
		assert.Contains(t, []string{"42P05", "26000", "08P01"}, pgErr.Code, "%v", err)
		t.Logf("claim through PgBouncer: %v", err)
		assert.Contains(t, err.Error(), "default_query_exec_mode=exec")
		assert.Contains(t, err.Error(), "pgx.QueryExecModeExec")
		assert.Contains(t, logged.String(), "default_query_exec_mode=exec", "the logged claim failure carries the hint too")
		require.NoError(t, lease.Unlock(ctx))
	})

	t.Run("RefusedConnectionReadsAsDatabaseUnreachable", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		dsn := "host=127.0.0.1 port=" + strconv.Itoa(closedPort(t)) + " user=postgres dbname=postgres sslmode=disable connect_timeout=5"
		pool := pgtest.PoolWith(t, dsn, nil)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, pgtest.TableName(), "down", pglease.WithHook(events.Hook))

		_, err := l.Claim(ctx, "k")
		require.Error(t, err)
		require.ErrorIs(t, err, syscall.ECONNREFUSED, "the dial error is wrapped: %v", err)
		var connect *pgconn.ConnectError
		require.ErrorAs(t, err, &connect)
		t.Logf("claim of a database that is down: %v", err)
		assert.Contains(t, err.Error(), "could not connect to the database (unreachable")
		assert.NotContains(t, err.Error(), "for a connection from the pool", "a database that is down is not a pool in use")
		require.NotErrorIs(t, err, pglease.ErrHeld)
		failed := events.WaitFor(t, pglease.EventClaimFailed, 5*time.Second)
		assert.Contains(t, failed.Err.Error(), "could not connect to the database")
	})

	t.Run("ConnectionTheServerRefusesReadsAsRefused", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
			cfg.ConnConfig.Database = "pglease_no_such_database"
		})
		l := pgtest.Locker(t, pool, pgtest.TableName(), "refused")
		_, err := l.Claim(ctx, "k")
		require.Error(t, err)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, err, &pgErr, "the server's answer is wrapped")
		assert.Equal(t, "3D000", pgErr.Code) // invalid_catalog_name
		assert.Contains(t, err.Error(), "could not connect to the database (the server refused")
		assert.NotContains(t, err.Error(), "unreachable")
		assert.NotContains(t, err.Error(), "for a connection from the pool")
	})

	t.Run("HeartbeatOnUnreachableDatabaseSaysSoWhenTheLeaseIsLost", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table := pgtest.Table(t, pgtest.Pool(t, nil))
		proxy := pgtest.Proxy(t, "")
		pool := pgtest.AppPool(t, "", proxy, pgtest.AppName("unreachable"))
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "hb", pglease.WithTTL(time.Second),
			pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		proxy.Stop() // open connections reset, new ones refused
		pgtest.WaitDone(t, lease, 10*time.Second)
		err = lease.Err()
		t.Logf("lease lost while the database is down: %v", err)
		require.ErrorIs(t, err, pglease.ErrLost)
		assert.Contains(t, err.Error(), "could not connect to the database (unreachable", "the loss names the cause: %v", err)
		assert.NotContains(t, err.Error(), "for a connection from the pool")
		var sawUnreachable bool
		for _, e := range events.All() {
			if e.Kind == pglease.EventHeartbeatFailed && e.Err != nil {
				assert.NotContains(t, e.Err.Error(), "for a connection from the pool")
				sawUnreachable = sawUnreachable || errors.Is(e.Err, syscall.ECONNREFUSED)
			}
		}
		assert.True(t, sawUnreachable, "a failed heartbeat round wraps the refused connection")
	})
}
