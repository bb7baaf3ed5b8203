package pgbouncer_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

func TestBouncerPoolsTransactionsOfManyClientsOverFewServerConnections(t *testing.T) {
	b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolSize: 2})
	ctx := context.Background()
	var pids = map[int32]bool{}
	for range 6 {
		cfg, err := pgx.ParseConfig(b.DSN())
		require.NoError(t, err)
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(ctx) })
		var pid int32
		require.NoError(t, conn.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&pid))
		pids[pid] = true
	}
	require.LessOrEqual(t, len(pids), 2, "six clients share the pool of two server connections")
	t.Logf("PgBouncer %v", b.Version())
}

func TestAtLeastComparesMajorThenMinor(t *testing.T) {
	for _, c := range []struct {
		v    []int
		want bool
	}{{[]int{1, 18, 0}, false}, {[]int{1, 21, 0}, true}, {[]int{1, 24}, true}, {[]int{2, 0, 0}, true}, {nil, false}} {
		require.Equal(t, c.want, pgbouncer.AtLeast(c.v, 1, 21), "%v", c.v)
	}
}
