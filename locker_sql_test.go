package pglease_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/lib/pq"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// sqlDrivers are the database/sql drivers SQL is tested with.
var sqlDrivers = []string{"pgx", "pq"}

// sqlSetup is pgtest.Setup with a database/sql pool of driver on the same
// server, and its DB of SQL.
func sqlSetup(t *testing.T, driver string) (context.Context, *pgxpool.Pool, string, *sql.DB, pglease.DB) {
	t.Helper()
	ctx, pool, table := pgtest.Setup(t)
	db := pgtest.OpenSQL(t, pool, driver)
	return ctx, pool, table, db, pglease.SQL(db)
}

// whileClaimsWait claims each key on l in the background (their rows
// locked by lockFreeRows), for at most 3*ttl; once one of the claims waits
// on its row lock, it lets several heartbeat rounds go by (5*ttl/2) and
// runs check. Then it cancels the claims and returns what they returned.
func whileClaimsWait(ctx context.Context, t *testing.T, pool pglease.DB, l *pglease.Locker, ttl time.Duration, keys []string, check func()) []pgtest.Claimed {
	t.Helper()
	cctx, cancel := context.WithTimeout(ctx, 3*ttl)
	defer cancel()
	var waiting []<-chan pgtest.Claimed
	for _, key := range keys {
		waiting = append(waiting, pgtest.ClaimInBackground(cctx, l, key))
	}
	pgtest.LockWaiter(t, pool, "", "INSERT INTO", 5*time.Second)
	time.Sleep(5 * ttl / 2)
	check()
	cancel()
	claimed := make([]pgtest.Claimed, len(waiting))
	for i, w := range waiting {
		claimed[i] = <-w
	}
	return claimed
}

// failFirst fails the first statement of kind with err, unsent
// (pgtest.TracedConnector), and counts the statements of kind (n) and of
// every kind (all) but the Locker's one read of its table before its first
// claim (tablecheck).
type failFirst struct {
	kind   string
	err    error
	n, all atomic.Int32
}

func (f *failFirst) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	kind := pgtest.StatementKind(data.SQL)
	if kind != "tablecheck" {
		f.all.Add(1)
	}
	if kind == f.kind && f.n.Add(1) == 1 {
		return pgtest.FailStatement(ctx, f.err)
	}
	return ctx
}

func (f *failFirst) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func TestSQL(t *testing.T) {
	t.Parallel()

	// Guarantee: the server's errors read as *pgconn.PgError whatever the
	// driver, with their fields, and lib/pq's *pq.Error stays in the chain:
	// the core classifies 55P03, 57014 and 40001 by it.
	for _, driver := range sqlDrivers {
		t.Run("ServerErrorsReadAsPgError/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, db := sqlSetup(t, driver)
			l := pgtest.Locker(t, pool, table, "a")
			_, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			end := pgtest.LockRow(t, pool, table, "job")
			defer end(false)

			code := func(err error) string {
				t.Helper()
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				if driver == "pq" {
					var pqErr *pq.Error
					require.ErrorAs(t, err, &pqErr, "the driver's error stays in the chain")
					assert.Equal(t, pgErr.Code, string(pqErr.Code))
				}
				return pgErr.Code
			}
			_, err = db.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR UPDATE NOWAIT`, table))
			assert.Equal(t, "55P03", code(err), "lock_not_available: %v", err)

			tx, err := db.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SET LOCAL statement_timeout = '20ms'`)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, `SELECT pg_sleep(2)`)
			assert.Equal(t, "57014", code(err), "query_canceled: %v", err)
			require.NoError(t, tx.Rollback(ctx))

			err = db.QueryRow(ctx, `DO $$ BEGIN RAISE EXCEPTION USING ERRCODE = '40001', MESSAGE = 'm', DETAIL = 'd', HINT = 'h'; END $$`).Scan()
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr)
			assert.Equal(t, "40001", code(err))
			assert.Equal(t, []string{"ERROR", "m", "d", "h"}, []string{pgErr.Severity, pgErr.Message, pgErr.Detail, pgErr.Hint})
		})
	}

	// Guarantee: a serialization failure lib/pq reports is retried by the
	// core as pgx's is (driver.RetrySerialization): the claim succeeds, in two
	// statements.
	t.Run("SerializationFailureOfLibPqIsRetried", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		fail := &failFirst{kind: "claim", err: &pq.Error{Severity: "ERROR", Code: "40001", Message: "could not serialize access due to concurrent update"}}
		traced := pgtest.PoolWith(t, pool.Config().ConnString(), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = fail })
		l := pgtest.Locker(t, pglease.SQL(pgtest.OpenSQL(t, traced, "pq")), table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		assert.Equal(t, int32(2), fail.n.Load(), "the claim refused with 40001 was sent again")
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		assert.Equal(t, lease.Fence(), row.Fence)
	})

	// Guarantee: a claim that failed with driver.ErrBadConn is one whose
	// outcome is unknown (lib/pq reports a reply cut off after the server ran
	// the statement that way): the claim fails, reads the row to give back
	// what it may have committed, and leaves the key free; here it was
	// refused before sending, so the read finds nothing.
	t.Run("BadConnectionIsAnUnknownOutcome", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		fail := &failFirst{kind: "claim", err: fmt.Errorf("refused before sending: %w", driver.ErrBadConn)}
		traced := pgtest.PoolWith(t, pool.Config().ConnString(), func(cfg *pgxpool.Config) { cfg.ConnConfig.Tracer = fail })
		l := pgtest.Locker(t, pglease.SQL(pgtest.OpenSQL(t, traced, "pq")), table, "a")
		_, err := l.Claim(ctx, "job")
		require.ErrorIs(t, err, driver.ErrBadConn)
		assert.Equal(t, int32(2), fail.all.Load(), "the claim and the give-back's read of the row")
		_, ok := pgtest.ReadRow(t, pool, table, "job")
		assert.False(t, ok)
		_, err = l.Claim(ctx, "job")
		require.NoError(t, err)
	})

	// Guarantee: arguments reach the server whole on both drivers, also on
	// lib/pq, whose statements pglease sends with the arguments written in
	// their text: quotes, backslashes, dollar signs and comment marks in a
	// value, whatever standard_conforming_strings is; a $1 inside the
	// statement's own strings, quoted names, dollar quotes and comments
	// stays as written; a NULL stays NULL; a value PostgreSQL text cannot
	// hold (a NUL byte) is refused, naming the argument.
	for _, driver := range sqlDrivers {
		t.Run("ArgumentsReachTheServerWhole/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, _, _, _, db := sqlSetup(t, driver)
			const query = `SELECT $1::text AS "a$1", $2::bigint, $3::float8, $4::bool, $5::text IS NULL,
				'$1 '' $2' || $$ $1 $$ || E'\\ $1 \'' -- $1 ' " $$
				|| /* $1 /* $2 */ ' */ $6::text`
			for _, conforming := range []string{"on", "off"} {
				tx, err := db.Begin(ctx)
				require.NoError(t, err)
				_, err = tx.Exec(ctx, "SET LOCAL standard_conforming_strings = "+conforming)
				require.NoError(t, err)
				var text, rest string
				var big int64
				var f float64
				var b, null bool
				value := `it's a \ $1 -- /* "x" $$ é`
				require.NoError(t, tx.QueryRow(ctx, query, value, int64(-9223372036854775808), 1e-7, true, nil, "$2").
					Scan(&text, &big, &f, &b, &null, &rest), "standard_conforming_strings = %s", conforming)
				require.NoError(t, tx.Rollback(ctx))
				assert.Equal(t, value, text)
				assert.Equal(t, int64(-9223372036854775808), big)
				assert.Equal(t, 1e-7, f)
				assert.True(t, b)
				assert.True(t, null)
				assert.Equal(t, `$1 ' $2 $1 \ $1 '$2`, rest)
			}
			var got string
			err := db.QueryRow(ctx, `SELECT $1::text`, "a\x00b").Scan(&got)
			require.Error(t, err)
			if driver == "pq" {
				assert.Contains(t, err.Error(), "argument $1")
			}
		})
	}

	// Guarantee: arguments reach the server whole on both drivers (as
	// ArgumentsReachTheServerWhole): a time.Time is the same instant on the
	// server whatever its zone's offset (one with seconds, as a zone's local
	// mean time before 1900) and its year (BC); a key of a burst that is not
	// UTF-8 is refused as the server refuses it, never sent as another
	// text; a []byte given for a text parameter is its text.
	for _, driver := range sqlDrivers {
		t.Run("TimesTextsAndBytesReachTheServerWhole/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, _, _, _, db := sqlSetup(t, driver)
			ams, err := time.LoadLocation("Europe/Amsterdam")
			require.NoError(t, err)
			for _, tm := range []time.Time{
				time.Date(1900, 1, 1, 0, 0, 0, 0, ams), // +00:19:32
				time.Date(-5, 1, 1, 0, 0, 0, 0, time.UTC),
			} {
				var got time.Time
				require.NoError(t, db.QueryRow(ctx, `SELECT $1::timestamptz`, tm).Scan(&got), "%v", tm)
				assert.True(t, got.Equal(tm), "sent %v, the server read %v", tm, got)
				var same bool
				require.NoError(t, db.QueryRow(ctx, `SELECT ($1::timestamptz[])[1] = $2::timestamptz`, []time.Time{tm}, tm).Scan(&same), "%v", tm)
				assert.True(t, same, "an array's element %v differs from the value", tm)
			}
			var got string
			err = db.QueryRow(ctx, `SELECT ($1::text[])[1]`, []string{"a\xffb"}).Scan(&got)
			require.Error(t, err, "an element that is not UTF-8 reached the server as %q", got)
			got = ""
			require.NoError(t, db.QueryRow(ctx, `SELECT $1::text`, []byte("hi")).Scan(&got))
			assert.Equal(t, "hi", got)
		})
	}

	// Guarantee: array arguments reach the server whole on both drivers,
	// quotes, backslashes, commas and braces included, and the burst
	// statements that pass them claim and release.
	for _, driver := range sqlDrivers {
		t.Run("ArrayArguments/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, _, table, _, db := sqlSetup(t, driver)
			strs := []string{`a"b`, `c\d`, "e,f", "{g}", "NULL", "", "é"}
			floats := []float64{1.5, -2, 1e-7, 123456789.125}
			ints := []int64{1, -9223372036854775808, 42}
			var same bool
			require.NoError(t, db.QueryRow(ctx,
				`SELECT $1::text[] = ARRAY['a"b', 'c\d', 'e,f', '{g}', 'NULL', '', 'é']
					AND $2::float8[] = ARRAY[1.5, -2, 1e-7, 123456789.125]::float8[]
					AND $3::int8[] = ARRAY[1, -9223372036854775808, 42]::int8[]`,
				strs, floats, ints).Scan(&same))
			assert.True(t, same)

			l := pgtest.Locker(t, db, table, "a")
			keys := []string{"k1", "k'2", `k"3`}
			leases, errs := pglease.ClaimBurst(ctx, l, keys)
			for i, err := range errs {
				require.NoError(t, err, keys[i])
			}
			for _, err := range pglease.UnlockBurst(ctx, l, leases) {
				require.NoError(t, err)
			}
			b := pgtest.Locker(t, db, table, "b")
			for _, key := range keys {
				_, err := b.Claim(ctx, key)
				require.NoError(t, err, "released %q", key)
			}
		})
	}

	// Guarantee: on a *sql.DB the heartbeat is never queued behind claims
	// waiting on row locks: claims hold all but one of its connections.
	for _, driver := range sqlDrivers {
		t.Run("HeartbeatNotStalledBehindAWaitingClaim/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, driver)
			sdb.SetMaxOpenConns(2)
			keys := []string{"locked-1", "locked-2", "locked-3"}
			lockFreeRows(ctx, t, pool, table, keys...)
			// A heartbeat queued behind the claims would lose the lease
			// 1.8 s in, before the check at 5 s; one round slow on a
			// loaded machine must not (at a TTL of 1 s, a round of 400 ms
			// and one of 280 ms in flight lost it).
			const ttl = 2 * time.Second
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)

			claimed := whileClaimsWait(ctx, t, pool, l, ttl, keys, func() {
				require.NoError(t, lease.Err(), "the heartbeat waited behind the claims")
				assert.True(t, lease.ExpiresAt().After(time.Now()))
			})
			for _, r := range claimed {
				require.ErrorIs(t, r.Err, context.Canceled)
			}
		})
	}

	// Guarantee: GuardSQL refuses a lease that is no longer current, with
	// ErrLost, and leaves the *sql.Tx unable to commit: whether the row was
	// re-claimed (the server's error aborts it) or the lease ended locally
	// (GuardRefused aborts it).
	for _, driver := range sqlDrivers {
		t.Run("GuardSQLRefusesAStaleLease/"+driver, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, driver)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, db, table, "a")

			current, err := l.Claim(ctx, "current")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, sdb, ledger, current)
			require.NoError(t, current.GuardSQL(ctx, tx))
			require.NoError(t, tx.Commit())

			stolen, err := l.Claim(ctx, "stolen")
			require.NoError(t, err)
			_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET fence = fence + 1000 WHERE key = 'stolen'`, table))
			require.NoError(t, err)
			tx = ledgerTx(ctx, t, sdb, ledger, stolen)
			require.ErrorIs(t, stolen.GuardSQL(ctx, tx), pglease.ErrLost)
			require.Error(t, tx.Commit(), "a commit after a failed GuardSQL")

			ended, err := l.Claim(ctx, "ended")
			require.NoError(t, err)
			require.NoError(t, ended.Unlock(ctx))
			tx = ledgerTx(ctx, t, sdb, ledger, ended)
			require.ErrorIs(t, ended.GuardSQL(ctx, tx), pglease.ErrLost)
			require.Error(t, tx.Commit(), "a commit after a failed GuardSQL")

			require.Error(t, current.GuardSQL(ctx, nil))
			entries := pgtest.ReadLedger(t, pool, ledger)
			require.Len(t, entries, 1, "only the current lease's write committed")
			assert.Equal(t, "current", entries[0].Key)
		})
	}

	// Guarantee: SQL's Begin serves what pglease uses on a transaction
	// (Migrate, NewAdmin), and its other pgx.Tx methods say why they fail.
	t.Run("BeginServesWhatPgleaseUses", func(t *testing.T) {
		t.Parallel()
		ctx, pool, _, _, db := sqlSetup(t, "pq")
		table := pgtest.Table(t, db) // Migrate, in a transaction of Begin
		l := pgtest.Locker(t, pool, table, "a")
		_, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(db, pglease.WithTable(table))
		require.NoError(t, err)
		infos, err := admin.List(ctx)
		require.NoError(t, err)
		require.Len(t, infos, 1)
		assert.Equal(t, l.Holder(), infos[0].Holder)
		_, err = admin.Revoke(ctx, "job") // in a transaction of Begin
		require.NoError(t, err)

		tx, err := db.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Begin(ctx)
		require.ErrorContains(t, err, "not available on a database/sql transaction")
		_, err = tx.CopyFrom(ctx, pgx.Identifier{table}, []string{"key"}, pgx.CopyFromRows(nil))
		require.ErrorContains(t, err, "CopyFrom is not available")
		require.ErrorContains(t, tx.SendBatch(ctx, &pgx.Batch{}).Close(), "SendBatch is not available")
		_, err = tx.Prepare(ctx, "s", "SELECT 1")
		require.ErrorContains(t, err, "Prepare is not available")
		require.NoError(t, tx.Commit(ctx))
		require.ErrorIs(t, tx.Rollback(ctx), pgx.ErrTxClosed)
		require.ErrorIs(t, tx.Rollback(ctx), sql.ErrTxDone)
	})

	// Guarantee: WithKeptConnection is refused on a DB of SQL, naming why,
	// and SQL(nil) is refused as a nil DB.
	t.Run("KeptConnectionRefused", func(t *testing.T) {
		t.Parallel()
		_, _, table, _, db := sqlSetup(t, "pgx")
		_, err := pglease.New(db, pglease.WithTable(table), pglease.WithKeptConnection())
		require.ErrorIs(t, err, pglease.ErrInvalidOption)
		require.ErrorContains(t, err, "*pgxpool.Pool")
		_, err = pglease.New(pglease.SQL(nil))
		require.ErrorContains(t, err, "db is nil")
	})

	// Guarantee: under -sqldb the Lockers under test are on SQL, so that
	// the contract tests run there; without it, on the pool as given.
	t.Run("ModeBuildsLockersOnSQL", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		under := pgtest.Under(pool)
		if pgtest.SQLMode() == "" {
			assert.Same(t, pool, under)
			return
		}
		assert.Equal(t, fmt.Sprintf("%T", pglease.SQL(pgtest.SQLPool(t, pool))), fmt.Sprintf("%T", under))
		assert.NotEqual(t, fmt.Sprintf("%T", pool), fmt.Sprintf("%T", under))
	})
}
