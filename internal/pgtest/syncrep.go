package pgtest

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgserver"
)

// UnreplicatedSetup is PrivateSetup on a server on which every synchronous
// commit waits for a synchronous standby that never connects
// (synchronous_standby_names = 'absent'), as during a partition from it:
// such a commit returns only when a cancel request ends its wait, with
// success and a WARNING. The table is created before; the setting dies
// with the private server.
func UnreplicatedSetup(tb testing.TB) (context.Context, *pgserver.Server, *pgxpool.Pool, string) {
	tb.Helper()
	ctx, srv, p, table := PrivateSetup(tb)
	AbsentStandby(ctx, tb, srv.DSN())
	return ctx, srv, p, table
}

// AbsentStandby makes every synchronous commit on the server of dsn wait
// for a standby named "absent", and returns once a commit does: the
// server reloads its configuration asynchronously, so it commits probes
// until one waits and its wait, cut by a cancel request, ends with the
// server's WARNING.
func AbsentStandby(ctx context.Context, tb testing.TB, dsn string) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(tb, err)
	_, err = conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS pgtest_standby_probe (at timestamptz)`)
	require.NoError(tb, err)
	_, err = conn.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'absent'`)
	require.NoError(tb, err)
	_, err = conn.Exec(ctx, `SELECT pg_reload_conf()`)
	require.NoError(tb, err)
	require.NoError(tb, conn.Close(ctx))

	var cut atomic.Bool
	probe := CancelRequestPool(tb, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 1
		cfg.ConnConfig.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
			if n.Code == "01000" && strings.Contains(n.Message, "canceling wait for synchronous replication") {
				cut.Store(true)
			}
		}
	})
	require.NoError(tb, probe.Ping(ctx)) // connected before the probes' short contexts
	deadline := time.Now().Add(10 * time.Second)
	for !cut.Load() {
		require.True(tb, time.Now().Before(deadline), "no commit waited for the absent standby within 10s")
		pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := probe.Exec(pctx, `INSERT INTO pgtest_standby_probe VALUES (clock_timestamp())`) // WAL: the commit waits
		cancel()
		require.NoError(tb, err, "a commit whose wait for a synchronous standby is cancelled reports success")
	}
	probe.Close()
}

// StandbyBack undoes AbsentStandby: commits on the server of dsn wait for
// no standby once the server has reloaded its configuration, and those
// waiting then end.
func StandbyBack(ctx context.Context, tb testing.TB, dsn string) {
	tb.Helper()
	StandbyReady(ctx, tb, dsn)()
}

// StandbyReady readies StandbyBack and returns its last step, the reload
// alone: a test that must bring the standby back within a bound of the
// code under test (a read that waits a few hundred milliseconds on a
// commit's row lock) opens its connection and rewrites the configuration
// beforehand, not inside the bound, where a loaded machine may spend it.
// The configuration is rewritten, not reloaded: until back runs, commits
// still wait.
func StandbyReady(ctx context.Context, tb testing.TB, dsn string) (back func()) {
	tb.Helper()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(tb, err)
	_, err = conn.Exec(ctx, `ALTER SYSTEM RESET synchronous_standby_names`)
	if err != nil {
		_ = conn.Close(context.Background())
		require.NoError(tb, err)
	}
	return func() {
		tb.Helper()
		defer func() { _ = conn.Close(context.Background()) }()
		_, err := conn.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(tb, err)
	}
}

// CancelRequestPool is a pool on dsn whose statements are cancelled by a
// cancel request as their context ends (pgconn's
// CancelRequestContextWatcherHandler) instead of by closing the
// connection, pgx's default; configure, if not nil, changes more. It is
// closed at cleanup.
func CancelRequestPool(tb testing.TB, dsn string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	return PoolWith(tb, dsn, func(cfg *pgxpool.Config) {
		cfg.ConnConfig.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
			return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
		}
		if configure != nil {
			configure(cfg)
		}
	})
}
