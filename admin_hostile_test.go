package pglease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: the admin functions "work on a
// table of WithoutFenceColumn", an existing table pglease does not own,
// whose holder column the Locker accepts nullable (checkColumns asks only
// for a text type). One row with a NULL holder, written by the table's
// owner, makes List fail as a whole: `pglease status` shows nothing, not
// even the live lease beside it.
func TestListShowsEveryRowOfATableWithoutFenceColumnWhoseHolderIsNullable(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Name("lease_nfnull")
	ident := pgx.Identifier{table}.Sanitize()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, holder text, expires_at timestamptz NOT NULL)`, ident))
	require.NoError(t, err)
	l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithoutFenceColumn(), pglease.WithHeartbeatInterval(time.Second))
	_, err = l.Claim(ctx, "job")
	require.NoError(t, err, "the Locker accepts the table")
	_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, expires_at) VALUES ('reserved', NULL, now() - interval '1 day')`, ident))
	require.NoError(t, err)

	opts := []pglease.Option{pglease.WithTable(table), pglease.WithoutFenceColumn()}
	rows, err := pglease.List(ctx, pool, opts...)
	require.NoError(t, err, "one row without holder must not hide the table's leases")
	assert.Len(t, rows, 2)
	_, err = pglease.Revoke(ctx, pool, "reserved", opts...)
	assert.NoError(t, err, "a row without holder is not live: nothing to change, no error")
}

// Guarantee: "options a constructor would ignore are refused".
// WithKeptConnection on a DB that is not a *pgxpool.Pool is still ignored
// silently (its own comment says so): the operator believes the heartbeat
// has a connection of its own, and NewLocker says nothing.
func TestWithKeptConnectionOnADBItCannotKeepIsRefused(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(ctx) })
	var got any
	func() {
		defer func() { got = recover() }()
		l := pglease.NewLocker(conn, pglease.WithKeptConnection(), pglease.WithLogger(pgtest.Quiet))
		_ = l.Close(ctx)
	}()
	err, _ = got.(error)
	assert.ErrorIs(t, err, pglease.ErrInvalidOption, "NewLocker(*pgx.Conn, WithKeptConnection()) accepted an option it ignores (recovered %v)", got)
}

// Guarantee (Revoke lets nobody in before the holder stopped
// trusting): a job's short lease on a Locker with a long TTL, whose
// heartbeats fail, is revoked. The key must stay held on the server until
// after the holder's lease has ended by its own (short) trust deadline.
// The server and the test share one host clock.
func TestRevokeOfAShortJobLeaseWithFailingHeartbeatsLetsNobodyInBeforeItEnds(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	fdb := pgtest.NewFaultyDB(pool)
	a := pgtest.Locker(t, fdb, table, "a", pglease.WithTTL(30*time.Second), pglease.WithHeartbeatInterval(500*time.Millisecond))
	job := mustJob(t, a, pglease.WithTTL(2*time.Second))
	lease, err := job.Claim(ctx, "k")
	require.NoError(t, err)
	fdb.SetFail("heartbeat", fmt.Errorf("blackholed"))

	rev, err := pglease.Revoke(ctx, pool, "k", pglease.WithTable(table))
	require.NoError(t, err)
	require.True(t, rev.Changed)
	pgtest.WaitDone(t, lease, 5*time.Second)
	ended := time.Now()
	t.Logf("lease ended %v before the kept expiry (%v)", rev.ExpiresAt.Sub(ended), lease.Err())
	assert.True(t, ended.Before(rev.ExpiresAt), "the holder trusted its lease past the expiry Revoke kept")
	b := pgtest.Locker(t, pool, table, "b")
	_, err = b.Claim(ctx, "k")
	if time.Now().Before(rev.ExpiresAt) {
		assert.ErrorIs(t, err, pglease.ErrHeld)
	}
}
