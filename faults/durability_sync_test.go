package faults_test

import (
	"context"
	"fmt"
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

// With synchronous_commit off at any level, a commit returns before its WAL
// is flushed, and the WAL writer of crashServer flushes only every 10 s: a
// crash right after the claims loses every one still in the server's memory,
// and with them the sequence's advance. Each claim raises the setting for
// its own transaction, so every claim acknowledged before the crash is
// still live after it, and no fence is issued twice.
func TestAcknowledgedClaimsSurviveACrashWhateverTheSynchronousCommitDefault(t *testing.T) { //nolint:tparallel // the subtests crash one shared server in turn
	t.Parallel()
	srv := crashServer(t)
	const keys = 200
	for _, scope := range syncOffScopes {
		t.Run(scope.name, func(t *testing.T) {
			ctx := pgtest.Ctx(t)
			table := durableTable(t, srv)
			exec(t, srv.DSN(), scope.set...)
			t.Cleanup(func() { exec(t, srv.DSN(), scope.reset...) })
			pool := syncOffPool(t, srv.DSN(), scope)

			before := pgtest.Locker(t, pool, table, "before", pglease.WithTTL(time.Minute))
			fences := make(map[string]int64, keys)
			var maxFence int64
			for k := range keys {
				key := fmt.Sprintf("job-%d", k)
				lease, err := before.Claim(ctx, key)
				require.NoError(t, err)
				fences[key] = lease.Fence()
				maxFence = max(maxFence, lease.Fence())
			}
			crashAndRestart(t, srv)
			pool.Close()
			// Its leases' releases fail on the dead pool; the rows stay.
			_ = before.Close(ctx)

			after := pgtest.PoolAt(t, srv.DSN(), nil)
			lost := 0
			for key, fence := range fences {
				row, ok := pgtest.ReadRow(t, after, table, key)
				if !ok || row.Fence != fence || !row.Live {
					lost++
				}
			}
			require.Zero(t, lost, "of %d claims acknowledged before the crash, %d are gone or changed after it", keys, lost)

			other := pgtest.Locker(t, after, table, "other", pglease.WithTTL(time.Minute))
			for key := range fences {
				_, err := other.Claim(ctx, key)
				require.ErrorIs(t, err, pglease.ErrHeld, "%s was claimed before the crash and is live until its TTL", key)
			}
			lease, err := other.Claim(ctx, "fresh")
			require.NoError(t, err)
			require.Greater(t, lease.Fence(), maxFence, "a fence after the crash is above every fence issued before it")
		})
	}
}

// A heartbeat acknowledged to the Locker moved its lease's expiry, and the
// Locker trusts the lease until then: the crash must not bring the row back
// to an earlier expiry, which another holder could claim while this one
// still believes in its lease.
func TestAcknowledgedHeartbeatsSurviveACrashWhateverTheSynchronousCommitDefault(t *testing.T) {
	t.Parallel()
	srv := crashServer(t)
	ctx := pgtest.Ctx(t)
	scope := syncOffScopes[2] // database
	table := durableTable(t, srv)
	exec(t, srv.DSN(), scope.set...)
	pool := syncOffPool(t, srv.DSN(), scope)

	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "before", pglease.WithTTL(20*time.Second),
		pglease.WithHeartbeatInterval(time.Second), pglease.WithHook(events.Hook))
	const keys = 20
	leases := make([]*pglease.Lease, keys)
	for k := range leases {
		lease, err := l.Claim(ctx, fmt.Sprintf("job-%d", k))
		require.NoError(t, err)
		leases[k] = lease
	}
	// Right after a heartbeat round has extended every lease: the next one
	// is a second away.
	events.WaitFor(t, pglease.EventExtended, 5*time.Second)
	require.NoError(t, srv.Stop(pgserver.Immediate))
	require.NoError(t, srv.Start(ctx))
	after := pgtest.PoolAt(t, srv.DSN(), nil)
	for _, lease := range leases {
		believed := lease.ExpiresAt() // no heartbeat can succeed after the crash
		row, ok := pgtest.ReadRow(t, after, table, lease.Key())
		require.True(t, ok, "%s", lease.Key())
		require.Equal(t, lease.Fence(), row.Fence, "%s", lease.Key())
		require.False(t, row.ExpiresAt.Before(believed),
			"%s: the Locker believed in its lease until %v, the row after the crash expires at %v", lease.Key(), believed, row.ExpiresAt)
	}
	pool.Close()
	_ = l.Close(ctx)
}
