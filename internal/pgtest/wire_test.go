package pgtest_test

import (
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestWireKeepsTheRowsItHoldsWhenTheirConnectionRunsOn: rows whose reply
// a Wire holds back were read to their end, and their connection went back
// to the pool; the next statement on it must not change what they hand
// out (pgx keeps a result's field descriptions in its connection).
func TestWireKeepsTheRowsItHoldsWhenTheirConnectionRunsOn(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.MaxConns = 1 })
	w := pgtest.NewWire(t, pool)
	a := w.Arm(func(sql string) bool { return strings.Contains(sql, "AS held") }, pgtest.DelayReply)
	rows, err := w.Query(ctx, `SELECT 7 AS held`)
	require.NoError(t, err)

	// The pool's one connection, given back, runs a statement of other
	// columns.
	var x, y int
	require.NoError(t, pool.QueryRow(ctx, `SELECT 1 AS other, 2 AS more`).Scan(&x, &y))

	a.Deliver()
	fields := rows.FieldDescriptions()
	require.Len(t, fields, 1)
	require.Equal(t, "held", fields[0].Name)
	require.True(t, rows.Next())
	var got int
	require.NoError(t, rows.Scan(&got))
	require.Equal(t, 7, got)
	require.False(t, rows.Next())
	require.NoError(t, rows.Err())
}
