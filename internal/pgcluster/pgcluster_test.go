package pgcluster

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// A committed row survives a crash of the primary and the promotion of a
// synchronous standby, and the multi-host DSN finds the new primary, twice
// in a row (the old primary rebuilt as the standby in between).
func TestCommittedRowSurvivesCrashAndPromotionOfTheSynchronousStandby(t *testing.T) {
	skipUnderShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Synchronous: true, Logf: t.Logf})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	conn, err := pgx.Connect(ctx, c.DSN())
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `CREATE TABLE t (n int)`)
	require.NoError(t, err)
	_ = conn.Close(ctx)
	for n := 1; n <= 2; n++ {
		conn, err := pgx.Connect(ctx, c.DSN())
		require.NoError(t, err)
		_, err = conn.Exec(ctx, `INSERT INTO t VALUES ($1)`, n)
		require.NoError(t, err)
		_ = conn.Close(ctx)

		f, err := c.Fail(ctx)
		require.NoError(t, err)
		t.Logf("failover %d: promoted after %v, standby back after %v", n, f.Promoted, f.Rebuilt)

		conn, err = pgx.Connect(ctx, c.DSN())
		require.NoError(t, err)
		var count int
		var recovering bool
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*), pg_is_in_recovery() FROM t`).Scan(&count, &recovering))
		require.Equal(t, n, count)
		require.False(t, recovering)
		_ = conn.Close(ctx)
	}
}

// A partitioned synchronous standby confirms nothing: a commit on the
// primary waits for it (SyncRep) until Heal, and then returns.
func TestPartitionHoldsCommitsUntilHealed(t *testing.T) {
	skipUnderShort(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c, err := Start(ctx, Options{Synchronous: true, Logf: t.Logf})
	require.NoError(t, err)
	defer func() { require.NoError(t, c.Close()) }()

	conn, err := pgx.Connect(ctx, c.DSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, `CREATE TABLE t (n int)`)
	require.NoError(t, err)

	c.Partition()
	committed := make(chan error, 1)
	go func() {
		w, err := pgx.Connect(ctx, c.DSN())
		if err != nil {
			committed <- err
			return
		}
		defer w.Close(context.Background())
		_, err = w.Exec(ctx, `INSERT INTO t VALUES (1)`)
		committed <- err
	}()
	for waiting := 0; waiting == 0; {
		require.NoError(t, conn.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`).Scan(&waiting))
		select {
		case err := <-committed:
			t.Fatalf("the commit returned (%v) while the standby was partitioned", err)
		case <-time.After(10 * time.Millisecond):
		}
	}
	c.Heal()
	select {
	case err := <-committed:
		require.NoError(t, err)
	case <-ctx.Done():
		t.Fatal("the commit still waits after Heal")
	}
}

// skipUnderShort skips a test that starts PostgreSQL servers under -short,
// which runs only the tests that need none; the full run has no skip.
func skipUnderShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL servers: run without -short")
	}
}
