package pglease_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// insertAdminRow writes a row of table directly (quoted), with times
// relative to the server's clock.
func insertAdminRow(t *testing.T, db pglease.DB, quoted, key, holder string, acquiredAgo, expiresIn time.Duration) {
	t.Helper()
	_, err := db.Exec(context.Background(), fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		VALUES ($1, $2, clock_timestamp() - make_interval(secs => $3), clock_timestamp() + make_interval(secs => $4))`, quoted),
		key, holder, acquiredAgo.Seconds(), expiresIn.Seconds())
	require.NoError(t, err)
}

// refusingDB fails the test on any use: the admin functions must refuse
// bad input before they send anything.
type refusingDB struct{ t *testing.T }

func (r refusingDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	r.t.Error("Exec called")
	return pgconn.CommandTag{}, nil
}

func (r refusingDB) Query(context.Context, string, ...any) (pgx.Rows, error) {
	r.t.Error("Query called")
	return nil, fmt.Errorf("refused")
}

func (r refusingDB) QueryRow(context.Context, string, ...any) pgx.Row {
	r.t.Error("QueryRow called")
	return nil
}

func (r refusingDB) Begin(context.Context) (pgx.Tx, error) {
	r.t.Error("Begin called")
	return nil, fmt.Errorf("refused")
}

// adminOf is NewAdmin of opts on db, which must not fail.
func adminOf(tb testing.TB, db pglease.DB, opts ...pglease.Option) *pglease.Admin {
	tb.Helper()
	a, err := pglease.NewAdmin(db, opts...)
	require.NoError(tb, err)
	return a
}

// TestAdmin: List, Purge, Revoke and ForceExpire on every shape of table an
// operator meets, each judged by the server's clock.
func TestAdmin(t *testing.T) {
	t.Parallel()
	t.Run("SchemaQualifiedTableWhoseNameNeedsQuoting", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		schema, name := pgtest.Name("Ops$"), pgtest.Name("Leases_T")
		table := schema + "." + name
		quoted := pgx.Identifier{schema, name}.Sanitize()
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{schema}.Sanitize())
		require.NoError(t, err)
		adm := adminOf(t, pool, pglease.WithTable(table))
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))

		a := pgtest.Locker(t, pool, table, "replica-a", pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithTTL(10*time.Second))
		lease, err := a.Claim(ctx, "b-job")
		require.NoError(t, err)
		insertAdminRow(t, pool, quoted, "a-old", "replica-gone", 3*time.Hour, -2*time.Hour)
		insertAdminRow(t, pool, quoted, "c-recent", "replica-gone", time.Hour, -10*time.Minute)

		rows, err := adm.List(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		assert.Equal(t, []string{"a-old", "b-job", "c-recent"}, []string{rows[0].Key, rows[1].Key, rows[2].Key}, "sorted by key")
		for _, r := range rows {
			assert.Equal(t, rows[0].ServerNow, r.ServerNow, "every row judged against one server instant")
		}
		assert.False(t, rows[0].Live)
		assert.InDelta(t, (-2 * time.Hour).Seconds(), rows[0].ExpiresAt.Sub(rows[0].ServerNow).Seconds(), 10)
		b := rows[1]
		assert.True(t, b.Live)
		assert.Equal(t, a.Holder(), b.Holder)
		assert.Equal(t, lease.Fence(), b.Fence)
		assert.True(t, lease.AcquiredAt().Equal(b.AcquiredAt))
		assert.InDelta(t, (10 * time.Second).Seconds(), b.ExpiresAt.Sub(b.ServerNow).Seconds(), 5, "a TTL (10s)")

		purged, err := adm.Purge(ctx, time.Hour)
		require.NoError(t, err)
		assert.Equal(t, int64(1), purged, "only the row expired longer than the horizon ago")
		rows, err = adm.List(ctx)
		require.NoError(t, err)
		assert.Len(t, rows, 2)

		rev, err := adm.Revoke(ctx, "b-job")
		require.NoError(t, err)
		assert.True(t, rev.Changed)
		assert.Equal(t, a.Holder(), rev.Row.Holder, "the row as found")
		assert.True(t, rev.ExpiresAt.Equal(rev.Row.ExpiresAt), "revoking keeps the expiry")
		pgtest.WaitDone(t, lease, 5*time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost, "the holder loses it at its next heartbeat")
		_, err = a.Claim(ctx, "b-job")
		require.ErrorIs(t, err, pglease.ErrHeld, "and cannot take it back before its expiry")

		again, err := adm.Revoke(ctx, "b-job")
		require.NoError(t, err)
		assert.False(t, again.Changed, "revoked already")
		assert.Equal(t, "pglease:revoked", again.Row.Holder, "the revoke marker")
		assert.True(t, again.Row.Revoked, "revoked already")

		forced, err := adm.ForceExpire(ctx, "b-job")
		require.NoError(t, err)
		assert.True(t, forced.Changed)
		assert.False(t, forced.ExpiresAt.After(forced.ServerNow), "expired at once")
		taken, err := pgtest.Locker(t, pool, table, "replica-b").Claim(ctx, "b-job")
		require.NoError(t, err, "claimable at once after ForceExpire")
		assert.Greater(t, taken.Fence(), lease.Fence())

		unchanged, err := adm.ForceExpire(ctx, "c-recent")
		require.NoError(t, err)
		assert.False(t, unchanged.Changed, "a key that is not live is left as it was")
	})

	t.Run("TableWithoutFenceColumn", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Name("lease_nf")
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)`, table))
		require.NoError(t, err)
		l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithoutFenceColumn(), pglease.WithHeartbeatInterval(50*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		adm := adminOf(t, pool, pglease.WithTable(table), pglease.WithoutFenceColumn())

		rows, err := adm.List(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		assert.Equal(t, lease.Holder(), rows[0].Holder)
		assert.Zero(t, rows[0].Fence, "no fence column")
		assert.True(t, rows[0].AcquiredAt.IsZero(), "no acquired_at column")
		assert.True(t, rows[0].Live)

		rev, err := adm.Revoke(ctx, "job")
		require.NoError(t, err)
		assert.True(t, rev.Changed)
		pgtest.WaitDone(t, lease, 5*time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)

		n, err := adm.Purge(ctx, time.Hour)
		require.NoError(t, err)
		assert.Zero(t, n, "the live revoked row stays")
	})

	// Guarantee: the admin functions "work on a
	// table of WithoutFenceColumn", an existing table pglease does not own,
	// whose holder column the Locker accepts nullable (checkColumns asks only
	// for a text type). One row with a NULL holder, written by the table's
	// owner, makes List fail as a whole: `pglease status` shows nothing, not
	// even the live lease beside it.
	t.Run("ListShowsEveryRowOfATableWhoseHolderIsNullable", func(t *testing.T) {
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

		adm := adminOf(t, pool, pglease.WithTable(table), pglease.WithoutFenceColumn())
		rows, err := adm.List(ctx)
		require.NoError(t, err, "one row without holder must not hide the table's leases")
		assert.Len(t, rows, 2)
		_, err = adm.Revoke(ctx, "reserved")
		assert.NoError(t, err, "a row without holder is not live: nothing to change, no error")
	})

	t.Run("RefusesBadInputNamingItAndSendsNothing", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		db := refusingDB{t}
		adm := adminOf(t, db)
		revoke := func(key string) error {
			_, err := adm.Revoke(ctx, key)
			return err
		}
		newAdmin := func(opts ...pglease.Option) error {
			_, err := pglease.NewAdmin(db, opts...)
			return err
		}
		for name, c := range map[string]struct {
			err  error
			want string
		}{
			"purge below an hour": {err: func() error { _, err := adm.Purge(ctx, 59*time.Minute); return err }(),
				want: "older than 59m0s: must be at least 1h0m0s: a claim draws its fence before it inserts its row"},
			"bad table":            {err: newAdmin(pglease.WithTable("a;b")), want: `WithTable: table name "a;b"`},
			"empty table":          {err: newAdmin(pglease.WithTable("")), want: "WithTable: table name is empty"},
			"nil db":               {err: func() error { _, err := pglease.NewAdmin(nil); return err }(), want: "pglease: new admin: db is nil"},
			"revoke empty key":     {err: revoke(""), want: `pglease: revoke "": key is empty`},
			"revoke NUL key":       {err: revoke("a\x00b"), want: "NUL byte"},
			"force expire bad key": {err: func() error { _, err := adm.ForceExpire(ctx, "\xff"); return err }(), want: `pglease: force expire "\xff": key is not valid UTF-8`},
			"three-part table":     {err: newAdmin(pglease.WithTable("x.y.z")), want: `want "name" or "schema.name"`},
		} {
			require.Error(t, c.err, name)
			assert.Contains(t, c.err.Error(), c.want, name)
		}
	})

	t.Run("RevokeOfAMissingKeyOrAHolderColumnTooShortWritesNothing", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Name("lease_short")
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, holder varchar(10) NOT NULL, expires_at timestamptz NOT NULL);
			INSERT INTO %[1]s VALUES ('job', 'old-lib-1', clock_timestamp() + interval '1 hour')`, table))
		require.NoError(t, err)
		adm := adminOf(t, pool, pglease.WithTable(table))
		before, err := adm.List(ctx)
		require.NoError(t, err)

		_, err = adm.Revoke(ctx, "job")
		require.Error(t, err)
		assert.Contains(t, err.Error(), "too short for the revoke marker")
		assert.Contains(t, err.Error(), "ForceExpire")
		_, err = adm.Revoke(ctx, "missing")
		require.ErrorIs(t, err, pglease.ErrNotFound)
		assert.Contains(t, err.Error(), `revoke "missing": in table `+table)

		after, err := adm.List(ctx)
		require.NoError(t, err)
		require.Len(t, after, 1)
		after[0].ServerNow = before[0].ServerNow
		assert.Equal(t, before, after, "nothing written")
	})

	// A row pinned with expires_at = 'infinity' (the CHECK allows it) or
	// claimed at '-infinity' is listed with the rest of the table, not a
	// failure of the whole listing: the pinned row is live, never expires and
	// reads as the latest instant a timestamptz holds. Revoke takes it from its
	// holder, and ForceExpire then ends it, so that another holder claims it.
	t.Run("RowPinnedToInfinity", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		quoted := pgx.Identifier{table}.Sanitize()
		adm := adminOf(t, pool, pglease.WithTable(table))
		a := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(10*time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond))
		lease, err := a.Claim(ctx, "pinned")
		require.NoError(t, err)
		kept, err := a.Claim(ctx, "kept")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE `+quoted+` SET expires_at = 'infinity' WHERE key = 'pinned';
			INSERT INTO `+quoted+` (key, holder, acquired_at, expires_at) VALUES ('ancient', 'replica-gone', '-infinity', clock_timestamp() - interval '1 hour')`)
		require.NoError(t, err)

		rows, err := adm.List(ctx)
		require.NoError(t, err)
		require.Len(t, rows, 3)
		ancient, keptRow, pinned := rows[0], rows[1], rows[2]
		assert.Equal(t, "ancient", ancient.Key)
		assert.False(t, ancient.Live)
		assert.False(t, ancient.NeverExpires)
		assert.True(t, ancient.AcquiredAt.Before(time.Date(-4712, 1, 1, 0, 0, 0, 0, time.UTC)), "-infinity reads as the earliest instant: %v", ancient.AcquiredAt)
		assert.Equal(t, "kept", keptRow.Key)
		assert.True(t, keptRow.Live)
		assert.False(t, keptRow.NeverExpires)
		assert.Equal(t, "pinned", pinned.Key)
		assert.True(t, pinned.Live)
		assert.True(t, pinned.NeverExpires)
		assert.Equal(t, 294276, pinned.ExpiresAt.Year())
		assert.Equal(t, time.Duration(math.MaxInt64), pinned.ExpiresAt.Sub(pinned.ServerNow), "it never expires")

		rev, err := adm.Revoke(ctx, "pinned")
		require.NoError(t, err)
		assert.True(t, rev.Changed)
		assert.True(t, rev.Row.NeverExpires)
		assert.Equal(t, a.Holder(), rev.Row.Holder)
		assert.Equal(t, 294276, rev.ExpiresAt.Year(), "revoking keeps the expiry")
		pgtest.WaitDone(t, lease, 5*time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost, "the holder loses it at its next heartbeat")
		require.NoError(t, kept.Err(), "and keeps its other lease")

		forced, err := adm.ForceExpire(ctx, "pinned")
		require.NoError(t, err)
		assert.True(t, forced.Changed)
		assert.True(t, forced.Row.NeverExpires)
		assert.False(t, forced.ExpiresAt.After(forced.ServerNow), "expired at once")
		taken, err := pgtest.Locker(t, pool, table, "replica-b").Claim(ctx, "pinned")
		require.NoError(t, err, "claimable once force expired")
		assert.Greater(t, taken.Fence(), lease.Fence())

		_, err = pool.Exec(ctx, `UPDATE `+quoted+` SET expires_at = 'infinity' WHERE key = 'kept'`)
		require.NoError(t, err)
		forced, err = adm.ForceExpire(ctx, "kept")
		require.NoError(t, err, "ForceExpire ends a pinned row directly")
		assert.True(t, forced.Changed)
		pgtest.WaitDone(t, kept, 5*time.Second)
	})

	// A table whose holder column may be NULL (one an older library or a hand
	// wrote) can hold a live row without holder: Revoke and ForceExpire change
	// it as any other, matching its holder as NULL while the row is locked.
	t.Run("LiveRowWithANullHolder", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Name("lease_nullable")
		for _, fenced := range []bool{true, false} {
			table := fmt.Sprintf("%s_%v", table, fenced)
			columns := `key text PRIMARY KEY, holder text, expires_at timestamptz NOT NULL, acquired_at timestamptz`
			if fenced {
				columns += `, fence bigint`
			}
			_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (%s);
				INSERT INTO %[1]s (key, holder, expires_at) VALUES ('revoked', NULL, clock_timestamp() + interval '1 hour'), ('forced', NULL, clock_timestamp() + interval '1 hour')`,
				table, columns))
			require.NoError(t, err)
			adm := adminOf(t, pool, pglease.WithTable(table))

			rev, err := adm.Revoke(ctx, "revoked")
			require.NoError(t, err, "fenced=%v", fenced)
			assert.True(t, rev.Changed)
			assert.Empty(t, rev.Row.Holder, "a NULL holder reads as empty")
			assert.True(t, rev.Row.Live)
			forced, err := adm.ForceExpire(ctx, "forced")
			require.NoError(t, err, "fenced=%v", fenced)
			assert.True(t, forced.Changed)
			assert.False(t, forced.ExpiresAt.After(forced.ServerNow))

			rows, err := adm.List(ctx)
			require.NoError(t, err)
			require.Len(t, rows, 2)
			assert.Equal(t, "forced", rows[0].Key)
			assert.False(t, rows[0].Live, "force expired")
			assert.False(t, rows[0].Revoked, "force expired, not revoked")
			assert.Equal(t, "revoked", rows[1].Key)
			assert.Equal(t, "pglease:revoked", rows[1].Holder, "revoked: the revoke marker")
			assert.True(t, rows[1].Revoked, "revoked")
			assert.True(t, rows[1].Live, "revoking keeps the expiry")
		}
	})

	// Guarantee (Revoke lets nobody in before the holder stopped
	// trusting): a job's short lease on a Locker with a long TTL, whose
	// heartbeats fail, is revoked. The key must stay held on the server until
	// after the holder's lease has ended by its own (short) trust deadline.
	// The server and the test share one host clock.
	t.Run("RevokeOfAShortJobLeaseLetsNobodyInBeforeItEnds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		fdb := pgtest.NewFaultyDB(pool)
		a := pgtest.Locker(t, fdb, table, "a", pglease.WithTTL(30*time.Second), pglease.WithHeartbeatInterval(500*time.Millisecond))
		job := mustJob(t, a, pglease.WithTTL(2*time.Second))
		lease, err := job.Claim(ctx, "k")
		require.NoError(t, err)
		fdb.SetFail("heartbeat", fmt.Errorf("blackholed"))

		rev, err := adminOf(t, pool, pglease.WithTable(table)).Revoke(ctx, "k")
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
	})

	// Guarantee: Revoke, ForceExpire and Purge report a change only when
	// its commit was confirmed: a commit whose wait for a synchronous
	// standby a cancel request cut short (pgx with a cancel-request
	// handler, lib/pq) is an error wrapping the context's end, not success.
	// Guarantee: List tells a lease its holder released (Unlock alone, a
	// release of many at Close) from one that lapsed, and a claim of a
	// released row makes it a live lease again, with no release time.
	t.Run("ListTellsAReleaseFromALapse", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a")
		one, err := l.Claim(ctx, "one")
		require.NoError(t, err)
		require.NoError(t, one.Unlock(ctx))
		again, err := l.Claim(ctx, "again")
		require.NoError(t, err)
		require.NoError(t, again.Unlock(ctx))
		_, err = l.Claim(ctx, "again")
		require.NoError(t, err)
		closed := pgtest.Locker(t, pool, table, "b")
		for _, key := range []string{"many-1", "many-2"} {
			_, err := closed.Claim(ctx, key)
			require.NoError(t, err)
		}
		require.NoError(t, closed.Close(ctx)) // one release of both
		insertAdminRow(t, pool, pgx.Identifier{table}.Sanitize(), "lapsed", "gone", time.Hour, -time.Minute)

		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		rows, err := admin.List(ctx)
		require.NoError(t, err)
		byKey := map[string]pglease.LeaseInfo{}
		for _, r := range rows {
			byKey[r.Key] = r
		}
		require.Len(t, byKey, 5)
		for _, key := range []string{"one", "many-1", "many-2"} {
			r := byKey[key]
			assert.False(t, r.Live, key)
			assert.False(t, r.ReleasedAt.IsZero(), "%s was released", key)
			assert.False(t, r.ReleasedAt.Before(r.AcquiredAt), "%s released after its claim", key)
		}
		assert.True(t, byKey["again"].Live)
		assert.True(t, byKey["again"].ReleasedAt.IsZero(), "claimed again after its release: live, not released")
		assert.True(t, byKey["lapsed"].ReleasedAt.IsZero(), "expired without a release")
	})
	t.Run("UnreplicatedChangeIsNotReportedDone", testAdminUnreplicated)
	// Guarantee: a cancel request the driver sent as an operator's
	// statement's context ended (a pool that cancels by cancel request,
	// shared with a Locker) never lands on a later statement: the
	// connection is closed, not given back, so the Locker's next claim,
	// whose commit waits for a synchronous standby, is never cut and handed
	// out.
	t.Run("CancelRequestNeverReachesALaterClaim", testAdminCancelRequest)
}

func testAdminUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, base := pgtest.PrivateSetup(t)
	dbs := map[string]pglease.DB{
		"pool-cancel-request": pgtest.CancelRequestPool(t, srv.DSN(), nil),
		"sql-pq":              pglease.SQL(pgtest.OpenSQL(t, pool, "pq")),
	}
	tableOf := func(name string) string { return base + "_" + strings.ReplaceAll(name, "-", "_") }
	for name := range dbs {
		table := tableOf(name) // each its own row to purge
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))
		quoted := pgx.Identifier{table}.Sanitize()
		l := pgtest.Locker(t, pool, table, "holder-"+name, pglease.WithTTL(time.Minute))
		for _, op := range []string{"revoke", "force"} {
			_, err := l.Claim(ctx, op+"-"+name)
			require.NoError(t, err)
		}
		insertAdminRow(t, pool, quoted, "old-"+name, "gone", 3*time.Hour, -2*time.Hour)
	}
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	for name, db := range dbs {
		adm := adminOf(t, db, pglease.WithTable(tableOf(name)))
		ops := map[string]func(context.Context) error{
			"Revoke": func(c context.Context) error { _, err := adm.Revoke(c, "revoke-"+name); return err },
			"ForceExpire": func(c context.Context) error {
				_, err := adm.ForceExpire(c, "force-"+name)
				return err
			},
			"Purge": func(c context.Context) error { _, err := adm.Purge(c, time.Hour); return err },
		}
		for op, run := range ops {
			t.Run(name+"/"+op, func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				err := run(cctx)
				require.Error(t, err, "a change whose commit was not replicated was reported done")
				require.ErrorIs(t, err, context.DeadlineExceeded)
			})
		}
	}
}

func testAdminCancelRequest(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
	cpool, warned := late.Pool(t, pool.Config().ConnString(), 2)
	l := pgtest.Locker(t, cpool, table, "holder", pglease.WithTTL(time.Minute))
	lease, err := l.Claim(ctx, "warm")
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))
	adm := adminOf(t, cpool, pglease.WithTable(table))
	pgtest.AbsentStandby(ctx, t, srv.DSN())

	// Purge's reply comes 500 ms late, past its 200 ms context: pgx sends
	// a cancel request, which lands 2.5 s later.
	late.DelayNextReply(500 * time.Millisecond)
	pctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = adm.Purge(pctx, time.Hour)
	cancel()
	require.Error(t, err)

	// The claim's commit waits for a standby that never answers: the claim
	// fails unless the late cancel request cuts that wait, which takes it
	// milliseconds once the request landed. It is given up 2 s after the
	// request landed (10 s at most), rather than at a fixed 6 s.
	got, err := claimUntilLanded(ctx, t, l, late, "free")
	require.Eventually(t, func() bool { return late.Landed() > 0 }, 10*time.Second, 50*time.Millisecond,
		"the late cancel request was delivered: the case is the one described")
	require.Error(t, err, "a lease was handed out whose commit's wait a late cancel request cut (%d WARNINGs)", warned.Load())
	require.Nil(t, got)
}
