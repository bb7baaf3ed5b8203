package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// stallClaims makes every claim of holder stall right after it has built
// its row (and so drawn its fence from the column's DEFAULT), before it
// looks for a conflicting row, until the returned function is called: a
// BEFORE INSERT trigger waits on an advisory lock the test holds. This is
// where a descheduled backend, or one waiting on another transaction, sits.
func stallClaims(t *testing.T, table, holder string) (resume func()) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	name := pgx.Identifier{table}.Sanitize()
	fn := pgx.Identifier{table + "_stall"}.Sanitize()
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF NEW.holder = %s THEN
        PERFORM pg_advisory_xact_lock_shared(hashtext(TG_TABLE_NAME));
    END IF;
    RETURN NEW;
END $$`, fn, quoteLiteral(holder)),
		fmt.Sprintf(`CREATE TRIGGER stall BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, name, fn),
		fmt.Sprintf(`SELECT pg_advisory_lock(hashtext(%s))`, quoteLiteral(table)),
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, "%s", stmt)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			require.NoError(t, conn.Close(context.Background())) // drops the advisory lock
		}
	}
	t.Cleanup(resume)
	return resume
}

func quoteLiteral(s string) string { return "'" + s + "'" } // test names only: no quotes in them

// waitStalled waits until a claim on table sits in the stall trigger.
func waitStalled(t *testing.T, db pglease.DB, table string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE $1`,
			"INSERT INTO "+pgx.Identifier{table}.Sanitize()+"%").Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the claim never reached the stall")
}

// Claim Y draws its fence and stalls; claim X takes the key with a greater
// fence and releases it; a purge at the shortest horizon pglease accepts
// runs; Y goes on. With a horizon of 0 the purge deleted X's row and Y
// inserted the key with its smaller fence. The horizon floor keeps X's row,
// so Y meets it and takes a fresh, greater fence.
func TestFenceNeverGoesBackwardsWhenAClaimStallsAcrossAPurge(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	resume := stallClaims(t, table, "y")
	y := pgtest.Locker(t, pool, table, "y")
	x := pgtest.Locker(t, pool, table, "x")

	type result struct {
		lease *pglease.Lease
		err   error
	}
	yDone := make(chan result, 1)
	go func() {
		lease, err := y.Claim(ctx, "k")
		yDone <- result{lease, err}
	}()
	waitStalled(t, pool, table)

	xLease, err := x.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, xLease.Unlock(ctx))

	// The shortest purge horizon pglease accepts.
	if err := pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(0)); err != nil {
		require.ErrorContains(t, err, "at least MinRetention", "a horizon of 0 is refused, saying why")
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(pglease.MinRetention)))
	}

	resume()
	var got result
	select {
	case got = <-yDone:
	case <-time.After(10 * time.Second):
		t.Fatal("the stalled claim never returned")
	}
	require.NoError(t, got.err, "X's lease was released: Y takes the key")
	require.Greater(t, got.lease.Fence(), xLease.Fence(),
		"Y's fence after X's: the fence went backwards across the purge")
	row, ok := pgtest.ReadRow(t, pool, table, "k")
	require.True(t, ok)
	require.Equal(t, got.lease.Fence(), row.Fence)
}

// No purge pglease runs deletes a row expired less than MinRetention ago,
// whatever horizon it is asked for.
func TestMigrateRefusesAPurgeHorizonBelowMinRetentionAndPurgesNothing(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ins := fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at) VALUES ($1, 'h', clock_timestamp() - $2::interval - interval '1 minute', clock_timestamp() - $2::interval)`,
		pgx.Identifier{table}.Sanitize())
	for key, ago := range map[string]string{"just-expired": "1 second", "expired-59m": "59 minutes", "expired-61m": "61 minutes"} {
		_, err := pool.Exec(ctx, ins, key, ago)
		require.NoError(t, err)
	}
	for _, d := range []time.Duration{0, time.Nanosecond, time.Minute, pglease.MinRetention - time.Microsecond} {
		err := pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(d))
		require.ErrorContains(t, err, "must be at least MinRetention (1h0m0s)", "WithRetention(%v)", d)
		require.ErrorContains(t, err, "a claim draws its fence before it inserts its row", "the refusal says why")
	}
	for _, key := range []string{"just-expired", "expired-59m", "expired-61m"} {
		_, ok := pgtest.ReadRow(t, pool, table, key)
		require.True(t, ok, "%s: a refused Migrate purges nothing", key)
	}
	require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(pglease.MinRetention)))
	for key, kept := range map[string]bool{"just-expired": true, "expired-59m": true, "expired-61m": false} {
		_, ok := pgtest.ReadRow(t, pool, table, key)
		require.Equal(t, kept, ok, "%s kept after a purge at MinRetention", key)
	}
}

// A lease table or fence sequence that an operator made UNLOGGED is emptied
// by a crash: every live lease could then be claimed again and every fence
// issued again. Migrate, which runs at every deploy, refuses it, naming the
// fix, and changes nothing.
func TestMigrateRefusesALeaseTableOrSequenceThatACrashWouldEmpty(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	for _, what := range []string{"TABLE", "SEQUENCE"} {
		table := pgtest.Table(t, pool)
		name := pgx.Identifier{table}.Sanitize()
		if what == "SEQUENCE" {
			name = pgx.Identifier{table + "_fence_seq"}.Sanitize()
		}
		_, err := pool.Exec(ctx, fmt.Sprintf(`ALTER %s %s SET UNLOGGED`, what, name))
		require.NoError(t, err)
		err = pglease.Migrate(ctx, pool, pglease.WithTable(table))
		require.ErrorContains(t, err, "is UNLOGGED: a crash would empty it", what)
		require.ErrorContains(t, err, "SET LOGGED", what)
		_, err = pool.Exec(ctx, fmt.Sprintf(`ALTER %s %s SET LOGGED`, what, name))
		require.NoError(t, err)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), what)
	}
}
