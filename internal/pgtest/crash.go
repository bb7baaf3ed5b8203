package pgtest

import (
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
)

// CrashableServer starts a durable PostgreSQL of the test's own (as
// PrivateServer: fsync and synchronous_commit on) whose WAL writer wakes
// only every 10 s, the maximum: a commit that does not wait for the WAL
// flush (a release, an asynchronous commit) then stays in the server's
// memory until the next synchronous one, so a crash (CrashAndRestart)
// right after it loses it, acknowledged as it was.
func CrashableServer(tb testing.TB) *pgserver.Server {
	tb.Helper()
	srv := PrivateServer(tb)
	ctx := Ctx(tb) // its 30 s from the server's start, however long that took
	conn, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(tb, err)
	_, err = conn.Exec(ctx, `ALTER SYSTEM SET wal_writer_delay = '10s'`)
	require.NoError(tb, err)
	require.NoError(tb, conn.Close(ctx))
	require.NoError(tb, srv.Restart(ctx, pgserver.Fast))

	conn, err = pgx.Connect(ctx, srv.DSN())
	require.NoError(tb, err)
	defer conn.Close(ctx)
	var fsync, syncCommit, delay string
	require.NoError(tb, conn.QueryRow(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit'), current_setting('wal_writer_delay')`).
		Scan(&fsync, &syncCommit, &delay))
	require.Equal(tb, []string{"on", "on", "10s"}, []string{fsync, syncCommit, delay}, "fsync, synchronous_commit, wal_writer_delay")
	return srv
}

// DurableTable creates a migrated lease table on srv and checkpoints, so
// that the table itself survives a crash of srv (CrashAndRestart) whatever
// the settings of the sessions that write to it.
func DurableTable(tb testing.TB, srv *pgserver.Server) string {
	tb.Helper()
	table := TableName()
	ctx := Ctx(tb)
	conn, err := pgx.Connect(ctx, srv.DSN())
	require.NoError(tb, err)
	defer conn.Close(ctx)
	require.NoError(tb, pglease.Migrate(ctx, conn, pglease.WithTable(table)))
	_, err = conn.Exec(ctx, `CHECKPOINT`)
	require.NoError(tb, err)
	return table
}

// CrashAndRestart kills srv without a checkpoint, as a crash would, and
// starts it again.
func CrashAndRestart(tb testing.TB, srv *pgserver.Server) {
	tb.Helper()
	require.NoError(tb, srv.Stop(pgserver.Immediate))
	require.NoError(tb, srv.Start(Ctx(tb)))
}
