package pglease_test

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	_ "github.com/lib/pq" // the "postgres" driver of pgtest.PQConnector
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// ledgerWrite inserts lease's entry into ledger in tx.
func ledgerWrite(ctx context.Context, t *testing.T, tx *sql.Tx, ledger string, lease *pglease.Lease) {
	t.Helper()
	_, err := tx.ExecContext(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, fence) VALUES ($1, $2, $3)`, ledger),
		lease.Key(), lease.Holder(), lease.Fence())
	require.NoError(t, err)
}

// ledgerTx begins a tx on sdb and inserts lease's entry into ledger in it.
func ledgerTx(ctx context.Context, t *testing.T, sdb *sql.DB, ledger string, lease *pglease.Lease) *sql.Tx {
	t.Helper()
	tx, err := sdb.BeginTx(ctx, nil)
	require.NoError(t, err)
	ledgerWrite(ctx, t, tx, ledger, lease)
	return tx
}

// requireUncommitted checks that tx, after a refused guard, can neither
// run a statement nor commit, and that ledger holds none of its writes.
func requireUncommitted(ctx context.Context, t *testing.T, tx *sql.Tx, pool *pgxpool.Pool, ledger string) {
	t.Helper()
	requireUnusable(ctx, t, tx)
	assert.Empty(t, pgtest.ReadLedger(t, pool, ledger))
}

// requireUnusable checks that tx, after a refused guard, can neither run
// a statement nor commit.
func requireUnusable(ctx context.Context, t *testing.T, tx *sql.Tx) {
	t.Helper()
	var one int
	require.Error(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one), "a statement after a refused GuardSQL")
	require.Error(t, tx.Commit(), "a commit after a refused GuardSQL")
}

// lostReplyConnector is lib/pq's connector whose first claim statement
// (while armed) runs on the server, to its commit, and then reports
// driver.ErrBadConn: what lib/pq reports when the connection ends with
// io.EOF or io.ErrUnexpectedEOF while it reads a statement's reply, or
// when the server sends a FATAL error (lib/pq's handleError).
type lostReplyConnector struct {
	driver.Connector
	armed atomic.Bool
	hits  atomic.Int32
}

func (c *lostReplyConnector) Connect(ctx context.Context) (driver.Conn, error) {
	pc, err := pgtest.ConnectPQ(ctx, c.Connector)
	if err != nil {
		return nil, err
	}
	return &lostReplyDriverConn{pc, c}, nil
}

type lostReplyDriverConn struct {
	pgtest.PQConn
	c *lostReplyConnector
}

func (c *lostReplyDriverConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	rows, err := c.PQConn.QueryContext(ctx, query, args)
	if err != nil || pgtest.StatementKind(query) != "claim" || !c.c.armed.CompareAndSwap(true, false) {
		return rows, err
	}
	dest := make([]driver.Value, len(rows.Columns()))
	for rows.Next(dest) == nil {
	}
	_ = rows.Close() // the statement has committed: its reply is now lost
	c.c.hits.Add(1)
	return nil, driver.ErrBadConn
}

// wrappingConnector is c behind a driver of another package, as tracing
// and metrics wrappers of database/sql (otelsql, sqlhooks) put it: every
// method passes through.
type wrappingConnector struct{ c driver.Connector }

// wrappedDriverConn is what pgx's stdlib and lib/pq connections both serve.
type wrappedDriverConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.QueryerContext
	driver.ExecerContext
	driver.Pinger
	driver.NamedValueChecker
	driver.SessionResetter
}

type wrappingDriver struct{ d driver.Driver }

func (d wrappingDriver) Open(string) (driver.Conn, error) {
	return nil, fmt.Errorf("open through the connector")
}

type wrappedConn struct{ wrappedDriverConn }

func (w wrappingConnector) Connect(ctx context.Context) (driver.Conn, error) {
	dc, err := w.c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	wc, ok := dc.(wrappedDriverConn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("a %T cannot be wrapped", dc)
	}
	return wrappedConn{wc}, nil
}

func (w wrappingConnector) Driver() driver.Driver { return wrappingDriver{w.c.Driver()} }

func TestSQLContract(t *testing.T) {
	t.Parallel()

	for _, drv := range sqlDrivers {
		// Shows: a lease revoked by Admin.Revoke (an Admin on SQL) cannot
		// guard a *sql.Tx: GuardSQL reports ErrLost, the tx can run nothing
		// more, and its write never commits.
		t.Run("GuardSQLAfterRevoke/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, db, table, "a")
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			admin, err := pglease.NewAdmin(db, pglease.WithTable(table))
			require.NoError(t, err)
			_, err = admin.Revoke(ctx, "job")
			require.NoError(t, err)

			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			require.ErrorIs(t, lease.GuardSQL(ctx, tx), pglease.ErrLost)
			requireUncommitted(ctx, t, tx, pool, ledger)
		})

		// Shows: a failed GuardSQL leaves a *sql.Tx that cannot commit even
		// while the caller holds a result set open on it, so that the
		// refusal may not be sendable on its connection: the lease ended
		// locally, or was taken over on the server.
		for _, locally := range []bool{true, false} {
			t.Run("GuardSQLOnABusyConnection/"+drv+"/"+map[bool]string{true: "EndedLocally", false: "TakenOverOnTheServer"}[locally], func(t *testing.T) {
				t.Parallel()
				ctx, pool, table, sdb, db := sqlSetup(t, drv)
				ledger := pgtest.NewLedger(t, pool)
				a1 := pgtest.Locker(t, db, table, "a")
				// A later mandate of a1's holder that a1 never saw.
				a2 := pgtest.Locker(t, db, table, "a", pglease.StoredHolder(a1.Holder()))
				first, err := a1.Claim(ctx, "job")
				require.NoError(t, err)
				if locally {
					require.NoError(t, first.Unlock(ctx))
				}
				later, err := a2.Claim(ctx, "job")
				require.NoError(t, err)

				tx := ledgerTx(ctx, t, sdb, ledger, first)
				rows, err := tx.QueryContext(ctx, `SELECT generate_series(1, 10000)`)
				require.NoError(t, err)
				require.True(t, rows.Next(), "the result set is open")
				gerr := first.GuardSQL(ctx, tx)
				require.Error(t, gerr)
				if locally {
					require.ErrorIs(t, gerr, pglease.ErrLost)
				}
				t.Logf("guard: %v", gerr)
				_ = rows.Close()
				require.Error(t, tx.Commit(), "the transaction of a failed GuardSQL committed")

				for _, e := range pgtest.ReadLedger(t, pool, ledger) {
					assert.NotEqual(t, first.Fence(), e.Fence, "a write of fence %d landed after fence %d's", first.Fence(), later.Fence())
				}
			})
		}

		// Shows: a lease whose row lapsed and was taken over by another
		// holder cannot guard a *sql.Tx, even though its heartbeat has not
		// yet noticed (the check is the server's).
		t.Run("GuardSQLAfterTakeover/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			a := pgtest.Locker(t, db, table, "a", pglease.WithTTL(30*time.Second))
			lease, err := a.Claim(ctx, "job")
			require.NoError(t, err)
			_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET acquired_at = clock_timestamp() - interval '2 seconds', expires_at = clock_timestamp() - interval '1 second' WHERE key = 'job'`, table))
			require.NoError(t, err)
			b := pgtest.Locker(t, db, table, "b")
			taken, err := b.Claim(ctx, "job")
			require.NoError(t, err)
			require.Greater(t, taken.Fence(), lease.Fence())

			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			require.ErrorIs(t, lease.GuardSQL(ctx, tx), pglease.ErrLost)
			requireUncommitted(ctx, t, tx, pool, ledger)
		})

		// Shows: under each isolation level a guarded tx begun after the
		// claim commits, or (REPEATABLE READ, SERIALIZABLE, after a
		// heartbeat extended the row) fails with 40001 and cannot commit;
		// never a commit after an error.
		for _, level := range []sql.IsolationLevel{sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable} {
			t.Run("GuardSQLIsolation/"+drv+"/"+strings.ReplaceAll(level.String(), " ", ""), func(t *testing.T) {
				t.Parallel()
				ctx, pool, table, sdb, db := sqlSetup(t, drv)
				ledger := pgtest.NewLedger(t, pool)
				l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
				lease, err := l.Claim(ctx, "job")
				require.NoError(t, err)
				tx, err := sdb.BeginTx(ctx, &sql.TxOptions{Isolation: level})
				require.NoError(t, err)
				ledgerWrite(ctx, t, tx, ledger, lease) // takes the snapshot
				// Heartbeats extend the row: two rounds, the second sent
				// after the first's reply, so after the snapshot.
				for range 2 {
					before := lease.ExpiresAt()
					require.Eventually(t, func() bool { return lease.ExpiresAt().After(before) }, 5*time.Second, 5*time.Millisecond, "a heartbeat round extended the lease")
				}
				err = lease.GuardSQL(ctx, tx)
				if err == nil {
					require.NoError(t, tx.Commit())
					require.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
					return
				}
				require.NotEqual(t, sql.LevelReadCommitted, level, "READ COMMITTED sees the extended row: %v", err)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr)
				assert.Equal(t, "40001", pgErr.Code, "%v", err)
				requireUncommitted(ctx, t, tx, pool, ledger)
			})
		}

		// Shows: a REPEATABLE READ tx whose snapshot predates the claim does
		// not see the lease's row: GuardSQL reports ErrLost (as Guard's doc
		// says) and the tx cannot commit.
		t.Run("GuardSQLSnapshotBeforeClaim/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			tx, err := sdb.BeginTx(ctx, &sql.TxOptions{Isolation: sql.LevelRepeatableRead})
			require.NoError(t, err)
			var one int
			require.NoError(t, tx.QueryRowContext(ctx, `SELECT 1`).Scan(&one)) // the snapshot
			l := pgtest.Locker(t, db, table, "a")
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			ledgerWrite(ctx, t, tx, ledger, lease)
			require.ErrorIs(t, lease.GuardSQL(ctx, tx), pglease.ErrLost)
			requireUncommitted(ctx, t, tx, pool, ledger)
		})

		// Shows: a tx in which the caller already failed a statement is
		// refused (an error, not nil) and still cannot commit.
		t.Run("GuardSQLAfterFailedStatement/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			l := pgtest.Locker(t, db, table, "a")
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			_ = pool
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			_, err = tx.ExecContext(ctx, `SELECT 1/0`)
			require.Error(t, err)
			err = lease.GuardSQL(ctx, tx)
			require.Error(t, err)
			require.ErrorContains(t, err, "aborted")
			require.Error(t, tx.Commit())
			require.NoError(t, lease.Err(), "the caller's failure is not the lease's")
		})

		// Shows: GuardSQL twice in one tx, and a tx on another database/sql
		// pool than the Locker's, both guard and commit.
		t.Run("GuardSQLTwiceOnAnotherPool/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			other := pgtest.OpenSQL(t, pool, drv)
			l := pgtest.Locker(t, db, table, "a")
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, other, ledger, lease)
			require.NoError(t, lease.GuardSQL(ctx, tx))
			require.NoError(t, lease.GuardSQL(ctx, tx))
			require.NoError(t, tx.Commit())
			require.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
		})

		// Shows: GuardSQL with a context that has already ended refuses and
		// leaves the tx (begun on a live context) unable to commit.
		t.Run("GuardSQLEndedContext/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, db, table, "a")
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			ended, cancel := context.WithCancel(ctx)
			cancel()
			require.Error(t, lease.GuardSQL(ended, tx))
			requireUncommitted(ctx, t, tx, pool, ledger)
		})

		// Guarantee: GuardSQL returns within 2s of its context's end while its
		// statement waits on the lease row's lock, whatever driver the
		// Locker runs on: here a Locker on pgx's pool and a *sql.Tx of
		// lib/pq (GORM on lib/pq beside a pgxpool), through a link with
		// 200 ms of latency each way, the row locked by another transaction
		// until long after the guard's caller gave up. lib/pq's one cancel
		// request must reach the guard's statement, not the connection idle
		// between a parse and an execute.
		t.Run("GuardSQLReturnsPromptlyWhateverTheLockersDriver/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			p := pgtest.Proxy(t, "")
			sdb := pgtest.OpenSQL(t, pgtest.AppPool(t, "", p, pgtest.AppName("guardcancel")), drv)
			for _, ms := range []int{100, 300, 500, 700} {
				after := time.Duration(ms) * time.Millisecond
				p.SetLatency(0, 0, 1)
				tx, err := sdb.BeginTx(ctx, nil)
				require.NoError(t, err)
				end := pgtest.LockRow(t, pool, table, "job")
				p.SetLatency(200*time.Millisecond, 0, 1)
				cctx, cancel := context.WithTimeout(ctx, after)
				res := make(chan error, 1)
				go func() { res <- lease.GuardSQL(cctx, tx) }()
				select {
				case err = <-res:
				case <-time.After(after + 2*answerGrace + 3*time.Second):
					end(true)
					t.Logf("GuardSQL, once the row was unlocked: %v", <-res)
					cancel()
					t.Fatalf("GuardSQL had not returned %v after its context ended %v into it", 2*answerGrace+3*time.Second, after)
				}
				took := time.Since(deadlineOf(cctx))
				cancel()
				end(true)
				require.Error(t, err)
				_ = tx.Rollback()
				assert.Less(t, took, 2*answerGrace, "GuardSQL's return after its context ended %v into it", after)
			}
		})

		// Shows: while a guarded tx is open, no other holder's claim of the
		// key succeeds, even after the row's expiry has passed (the claim
		// waits on the row or is refused), and the guarded write commits
		// before any later lease begins; once it has, the key can be taken.
		t.Run("GuardSQLHoldsOffAClaim/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			a := pgtest.Locker(t, db, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
			lease, err := a.Claim(ctx, "job")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			require.NoError(t, lease.GuardSQL(ctx, tx))

			b := pgtest.Locker(t, pool, table, "b")
			pgtest.WaitExpired(t, pool, table, "job", 10*time.Second)
			cctx, cancel := context.WithTimeout(ctx, time.Second)
			taken, err := b.Claim(cctx, "job")
			cancel()
			require.Error(t, err, "a claim went past a guarded tx's row lock: fence %v", taken)
			require.NoError(t, tx.Commit())
			pgtest.TakeOver(ctx, t, b, "job", lease, 5*time.Second) // the key once the guarded tx ended, with a greater fence
			require.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
		})

		// Shows: on a *sql.DB of one connection (SetMaxOpenConns(1)) a claim
		// waiting on a row lock must not starve the heartbeat: either New
		// refuses such a pool, or the lease is kept across TTLs.
		t.Run("HeartbeatOnPoolOfOne/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			sdb.SetMaxOpenConns(1)
			lockFreeRows(ctx, t, pool, table, "locked")

			const ttl = time.Second
			l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond))
			if err != nil {
				return // refused: the guarantee holds
			}
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			whileClaimsWait(ctx, t, pool, l, ttl, []string{"locked"}, func() {
				require.NoError(t, lease.Err(), "the heartbeat waited behind a claim on the only connection")
			})
		})

		// Shows: the bound on claims follows the pool's limit as it is when
		// claims run: a *sql.DB given SetMaxOpenConns(2) after New (it was
		// unlimited at New, as sql.Open leaves it) must not let claims
		// waiting on row locks take every connection from the heartbeat.
		t.Run("HeartbeatWhenLimitSetAfterNew/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			sdb.SetMaxOpenConns(0)
			keys := []string{"locked-1", "locked-2", "locked-3"}
			lockFreeRows(ctx, t, pool, table, keys...)
			const ttl = time.Second
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			sdb.SetMaxOpenConns(2)
			whileClaimsWait(ctx, t, pool, l, ttl, keys, func() {
				require.NoError(t, lease.Err(), "the heartbeat waited behind claims holding every connection")
			})
		})

		// Shows: with no idle connections kept and connections that live
		// 50ms, leases are kept across several TTLs, with their fences.
		t.Run("LeasesKeptOnChurningConnections/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			sdb.SetMaxIdleConns(0)
			sdb.SetConnMaxLifetime(50 * time.Millisecond)
			// A TTL of 1.5s leaves a round on a new connection, under the
			// race detector on a busy machine, about five tries.
			const ttl = 1500 * time.Millisecond
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(250*time.Millisecond))
			var leases []*pglease.Lease
			for _, key := range []string{"k1", "k2", "k3"} {
				lease, err := l.Claim(ctx, key)
				require.NoError(t, err)
				leases = append(leases, lease)
			}
			time.Sleep(4 * ttl)
			for _, lease := range leases {
				require.NoError(t, lease.Err(), lease.Key())
				row, ok := pgtest.ReadRow(t, pool, table, lease.Key())
				require.True(t, ok)
				assert.True(t, row.Live, lease.Key())
				assert.Equal(t, lease.Fence(), row.Fence)
			}
		})

		// Shows: burst statements carry keys that stress array literals
		// (spaces at the ends, tabs, newlines, NULL-looking, quotes,
		// braces, backslashes, unicode, a long key) and claim exactly those
		// rows, which another holder can claim once they are released.
		t.Run("BurstKeysAsArrayElements/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, db := sqlSetup(t, drv)
			l := pgtest.Locker(t, db, table, "a")
			pglease.SetCoalesceAll(l, true)
			keys := []string{" lead", "trail ", "tab\there", "new\nline", "null", "NULL", `"`, `\`, `\\"`, "{}", "a,b", "}{", "日本語🙂", strings.Repeat("x", 400)}
			leases, errs := pglease.ClaimBurst(ctx, l, keys)
			for i, err := range errs {
				require.NoError(t, err, "%q", keys[i])
				assert.Equal(t, keys[i], leases[i].Key())
				row, ok := pgtest.ReadRow(t, pool, table, keys[i])
				require.True(t, ok, "no row of %q", keys[i])
				assert.Equal(t, l.Holder(), row.Holder)
				assert.True(t, row.Live)
			}
			var n int
			require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s`, table)).Scan(&n))
			assert.Equal(t, len(keys), n, "rows of other keys than the burst's")
			for _, err := range pglease.UnlockBurst(ctx, l, leases) {
				require.NoError(t, err)
			}
			b := pgtest.Locker(t, db, table, "b")
			pglease.SetCoalesceAll(b, true)
			_, errs = pglease.ClaimBurst(ctx, b, keys)
			for i, err := range errs {
				require.NoError(t, err, "released %q", keys[i])
			}
		})

		// Shows: Close while claims wait on a row lock ends them promptly,
		// with an error, and leaves no goroutine (goleak in TestMain).
		t.Run("CloseWhileClaimsWait/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, db := sqlSetup(t, drv)
			lockFreeRows(ctx, t, pool, table, "locked")
			l, err := pglease.New(db, pglease.WithTable(table), pglease.WithHolder("a"))
			require.NoError(t, err)
			w1 := pgtest.ClaimInBackground(ctx, l, "locked")
			w2 := pgtest.ClaimInBackground(ctx, l, "locked")
			pgtest.LockWaiter(t, pool, "", "INSERT INTO", 5*time.Second)
			start := time.Now()
			require.NoError(t, l.Close(ctx))
			for _, w := range []<-chan pgtest.Claimed{w1, w2} {
				r := <-w
				require.Error(t, r.Err)
			}
			assert.Less(t, time.Since(start), 5*time.Second)
		})
	}

	for _, drv := range sqlDrivers {
		// Shows: a permission error of the server reads as
		// *pgconn.PgError 42501 on both drivers: a role that may read the
		// table but not write it cannot claim, and nothing is left behind.
		t.Run("PermissionDeniedReadsAs42501/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			role := runtimeRole(t, pool, `GRANT SELECT ON `+table+` TO %s`)
			l := pgtest.Locker(t, pglease.SQL(pgtest.OpenSQL(t, role, drv)), table, "a")
			_, err := l.Claim(ctx, "job")
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, "%v", err)
			assert.Equal(t, "42501", pgErr.Code)
			_, ok := pgtest.ReadRow(t, pool, table, "job")
			assert.False(t, ok)
		})

		// Shows: Migrate on SQL, run by several replicas at once on a new
		// table, succeeds for every one of them (no 23505 or 42P07 from
		// the race of CREATE ... IF NOT EXISTS), and the table serves a
		// claim.
		t.Run("ConcurrentMigrate/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, _ := pgtest.Setup(t)
			db := pglease.SQL(pgtest.OpenSQL(t, pool, drv))
			table := pgtest.TableName()
			errs := make(chan error, 4)
			for range 4 {
				go func() { errs <- pglease.Migrate(ctx, db, pglease.WithTable(table)) }()
			}
			for range 4 {
				require.NoError(t, <-errs)
			}
			l := pgtest.Locker(t, db, table, "a")
			_, err := l.Claim(ctx, "job")
			require.NoError(t, err)
		})

		// Shows: across a restart of the server (fast shutdown), a Locker
		// on SQL either keeps its lease or reports it lost, never both: a
		// lease it still calls held guards and commits a *sql.Tx, and the
		// Locker claims new keys on the same *sql.DB afterwards.
		t.Run("ServerRestart/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, srv, pool, table := pgtest.PrivateSetup(t)
			sdb := pgtest.OpenSQL(t, pool, drv)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(300*time.Millisecond))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			require.NoError(t, srv.Restart(ctx, pgserver.Fast))
			time.Sleep(time.Second)
			deadline := time.Now().Add(10 * time.Second)
			var next *pglease.Lease
			for {
				next, err = l.Claim(ctx, "after")
				if err == nil || time.Now().After(deadline) {
					break
				}
				time.Sleep(200 * time.Millisecond)
			}
			require.NoError(t, err, "a claim after the restart")
			_ = next
			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			if gerr := lease.GuardSQL(ctx, tx); gerr != nil {
				require.ErrorIs(t, gerr, pglease.ErrLost)
				require.Error(t, tx.Commit())
				return
			}
			require.NoError(t, tx.Commit())
			row, ok := pgtest.ReadRow(t, pool, table, "job")
			require.True(t, ok)
			assert.Equal(t, lease.Fence(), row.Fence)
			assert.Equal(t, l.Holder(), row.Holder)
		})

		// Shows: a guard that waits on the row (another transaction holds
		// it FOR UPDATE, as a claim in flight does) and whose context ends
		// returns an error and leaves the tx unable to commit.
		t.Run("GuardSQLWaitingWhenContextEnds/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(10*time.Second))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			end := pgtest.LockRow(t, pool, table, "job")
			gctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			gerr := lease.GuardSQL(gctx, tx)
			cancel()
			end(false)
			require.Error(t, gerr)
			requireUncommitted(ctx, t, tx, pool, ledger)
		})

		// Shows: a guard waiting on the row whose context ends as its
		// statement travels returns within answerGrace: through a link with
		// 200 ms of latency each way, the context ends 100 ms in (for a
		// driver that sent a parse and then an execute, lib/pq, the one
		// cancel request would reach the connection idle between them and
		// the guard would wait as long as the row lock is held).
		t.Run("GuardSQLReturnsPromptlyWhenItsContextEndsInFlight/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			p := pgtest.Proxy(t, "")
			sdb := pgtest.OpenSQL(t, pgtest.AppPool(t, "", p, pgtest.AppName("guardslow")), drv)
			l := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithTTL(10*time.Second))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback() })
			end := pgtest.LockRow(t, pool, table, "job")
			t.Cleanup(func() { end(false) })
			p.SetLatency(200*time.Millisecond, 0, 1)
			gctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			defer cancel()
			guarded := make(chan error, 1)
			go func() { guarded <- lease.GuardSQL(gctx, tx) }()
			select {
			case err := <-guarded:
				require.Error(t, err)
			case <-time.After(100*time.Millisecond + answerGrace):
				end(false)
				t.Fatalf("GuardSQL had not returned %v after its context ended", answerGrace)
			}
			p.SetLatency(0, 0, 1)
		})
	}

	for _, drv := range sqlDrivers {
		// Shows: on a table without a fence column (WithoutFenceColumn),
		// a Locker on SQL claims a key, GuardSQL
		// passes for the current mandate, and refuses, so that the tx
		// cannot commit, once another holder took the lapsed row.
		t.Run("WithoutFenceColumn/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			table, dsn := legacyTable(t, legacyColumns)
			pool := pgtest.PoolAt(t, dsn, nil)
			sdb := pgtest.OpenSQL(t, pool, drv)
			l := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithoutFenceColumn(), pglease.WithTTL(30*time.Second))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx, err := sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.NoError(t, lease.GuardSQL(ctx, tx))
			require.NoError(t, tx.Commit())

			_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = clock_timestamp() - interval '1 second' WHERE key = 'job'`, table))
			require.NoError(t, err)
			b := pgtest.Locker(t, pglease.SQL(sdb), table, "b", pglease.WithoutFenceColumn())
			_, err = b.Claim(ctx, "job")
			require.NoError(t, err)
			tx, err = sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.ErrorIs(t, lease.GuardSQL(ctx, tx), pglease.ErrLost)
			requireUnusable(ctx, t, tx)
		})
	}

	for _, drv := range sqlDrivers {
		// Shows: a claim given up (its context ends) just as the row lock it
		// waits on ends, so that it may commit before its cancel request
		// lands, leaves no live row that nobody holds: every failed claim's
		// row is soon not live for its holder.
		t.Run("GivenUpAsARowLockEnds/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, db := sqlSetup(t, drv)
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(30*time.Second))
			for i := range 12 {
				key := fmt.Sprintf("k%d", i)
				freeRow(ctx, t, pool, table, key)
				end := pgtest.LockRow(t, pool, table, key)
				gap := 150*time.Millisecond + time.Duration(i%4)*time.Millisecond
				timer := time.AfterFunc(gap, func() { end(false) })
				cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
				lease, err := l.Claim(cctx, key)
				cancel()
				timer.Stop()
				end(false)
				if err == nil {
					require.NoError(t, lease.Unlock(ctx))
					continue
				}
				require.Eventually(t, func() bool {
					row, ok := pgtest.ReadRow(t, pool, table, key)
					return ok && (!row.Live || row.Holder != l.Holder())
				}, 3*time.Second, 20*time.Millisecond, "a given-up claim of %q left a live row for a: %v", key, err)
			}
		})
	}

	// Shows: pgx's stdlib behind a wrapping driver (a tracing wrapper of
	// database/sql, as an OpenTelemetry setup has) claims and releases a
	// burst whose keys stress array literals, and guards a *sql.Tx.
	t.Run("WrappedPgxDriver", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		sdb := sql.OpenDB(wrappingConnector{stdlib.GetConnector(*pool.Config().ConnConfig.Copy())})
		t.Cleanup(func() { _ = sdb.Close() })
		sdb.SetMaxOpenConns(4)
		l := pgtest.Locker(t, pglease.SQL(sdb), table, "a")
		pglease.SetCoalesceAll(l, true)
		keys := []string{`q"1`, `b\2`, "c,3", "{d}", "NULL", " e "}
		leases, errs := pglease.ClaimBurst(ctx, l, keys)
		for i, err := range errs {
			require.NoError(t, err, "%q", keys[i])
			row, ok := pgtest.ReadRow(t, pool, table, keys[i])
			require.True(t, ok, "no row of %q", keys[i])
			assert.Equal(t, l.Holder(), row.Holder)
		}
		tx, err := sdb.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, leases[0].GuardSQL(ctx, tx))
		require.NoError(t, tx.Commit())
		for _, err := range pglease.UnlockBurst(ctx, l, leases) {
			require.NoError(t, err)
		}
	})

	// Shows: behind a wrapping driver (as a tracing wrapper puts it), a
	// claim on pgx's stdlib that is given up while it waits on a row lock
	// must still be cancelled on the server: once the lock ends, long after
	// the caller gave up, no live row is left that nobody holds.
	t.Run("WrappedPgxDriverGivenUpClaim", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		sdb := sql.OpenDB(wrappingConnector{stdlib.GetConnector(*pool.Config().ConnConfig.Copy())})
		t.Cleanup(func() { _ = sdb.Close() })
		sdb.SetMaxOpenConns(4)
		freeRow(ctx, t, pool, table, "job")
		end := pgtest.LockRow(t, pool, table, "job")
		t.Cleanup(func() { end(false) })

		l := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithTTL(30*time.Second))
		cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
		_, err := l.Claim(cctx, "job")
		cancel()
		require.Error(t, err)
		time.Sleep(3 * time.Second) // the caller has long given up
		end(false)
		time.Sleep(500 * time.Millisecond)
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		assert.False(t, row.Live && row.Holder == l.Holder(),
			"a claim given up 3s before its row lock ended took the row: live for %q (fence %d) until %v, and nobody holds it", row.Holder, row.Fence, row.ExpiresAt)
	})

	// Shows: pgx's stdlib in the simple protocol (as behind a transaction
	// pooler) claims, heartbeats and releases a burst whose keys stress
	// array literals, and GuardSQL fences its *sql.Tx.
	t.Run("PgxSimpleProtocol", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		cfg := pool.Config().ConnConfig.Copy()
		cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		sdb := stdlib.OpenDB(*cfg)
		t.Cleanup(func() { _ = sdb.Close() })
		sdb.SetMaxOpenConns(4)
		l := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		pglease.SetCoalesceAll(l, true)
		keys := []string{`q"1`, `b\2`, "c,3", "{d}", "NULL", " e ", "it's"}
		leases, errs := pglease.ClaimBurst(ctx, l, keys)
		for i, err := range errs {
			require.NoError(t, err, "%q", keys[i])
		}
		time.Sleep(1500 * time.Millisecond)
		for i, lease := range leases {
			require.NoError(t, lease.Err(), "%q kept across a TTL", keys[i])
			row, ok := pgtest.ReadRow(t, pool, table, keys[i])
			require.True(t, ok, "no row of %q", keys[i])
			assert.True(t, row.Live)
		}
		tx, err := sdb.BeginTx(ctx, nil)
		require.NoError(t, err)
		require.NoError(t, leases[1].GuardSQL(ctx, tx))
		require.NoError(t, tx.Commit())
		for _, err := range pglease.UnlockBurst(ctx, l, leases) {
			require.NoError(t, err)
		}
	})

	for _, drv := range sqlDrivers {
		// Shows: a READ COMMITTED guard that waits on another transaction's
		// lock of the row (the heartbeat skips the locked row meanwhile)
		// passes once that lock ends, its tx commits, and the heartbeat
		// then extends the lease again.
		t.Run("GuardSQLWaitsOutARowLock/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx := ledgerTx(ctx, t, sdb, ledger, lease)
			end := pgtest.LockRow(t, pool, table, "job")
			t.Cleanup(func() { end(false) })
			before := lease.ExpiresAt()
			guarded := make(chan error, 1)
			go func() { guarded <- lease.GuardSQL(ctx, tx) }()
			pgtest.LockWaiter(t, pool, "", "AS this_lease", 5*time.Second) // the guard waits on the row
			end(true)
			require.NoError(t, <-guarded)
			require.NoError(t, tx.Commit())
			require.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
			require.Eventually(t, func() bool { return lease.ExpiresAt().After(before) }, 3*time.Second, 20*time.Millisecond, "the heartbeat extended the lease")
			require.NoError(t, lease.Err())
		})
	}

	for _, drv := range sqlDrivers {
		// Shows: leases cross the kinds of DB: GuardSQL guards a *sql.Tx
		// with a lease of a Locker on a *pgxpool.Pool, and Guard a pgx.Tx
		// with a lease of a Locker on SQL; a stale one is refused either
		// way.
		t.Run("GuardAcrossKindsOfDB/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, sdb, db := sqlSetup(t, drv)
			ledger := pgtest.NewLedger(t, pool)
			onPool := pgtest.Locker(t, pool, table, "p")
			onSQL := pgtest.Locker(t, db, table, "s")
			pl, err := onPool.Claim(ctx, "on-pool")
			require.NoError(t, err)
			sl, err := onSQL.Claim(ctx, "on-sql")
			require.NoError(t, err)

			stx := ledgerTx(ctx, t, sdb, ledger, pl)
			require.NoError(t, pl.GuardSQL(ctx, stx))
			require.NoError(t, stx.Commit())

			ptx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, sl.Guard(ctx, ptx))
			require.NoError(t, ptx.Commit(ctx))

			_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET fence = fence + 1000`, table))
			require.NoError(t, err)
			stx, err = sdb.BeginTx(ctx, nil)
			require.NoError(t, err)
			require.ErrorIs(t, pl.GuardSQL(ctx, stx), pglease.ErrLost)
			requireUnusable(ctx, t, stx)
			ptx, err = pool.Begin(ctx)
			require.NoError(t, err)
			require.ErrorIs(t, sl.Guard(ctx, ptx), pglease.ErrLost)
			require.Error(t, ptx.Commit(ctx))
			require.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
		})
	}

	// Shows: a claim whose reply lib/pq reports as driver.ErrBadConn (what
	// it reports when the connection ends with io.EOF while it reads the
	// reply, or on a FATAL error) may have committed: it must be given
	// back, so that no live row is left that nobody holds, and another
	// holder can claim the key at once.
	t.Run("ClaimReplyLostAsBadConnIsGivenBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		c := &lostReplyConnector{Connector: pgtest.PQConnector(t, pool)}
		sdb := sql.OpenDB(c)
		t.Cleanup(func() { _ = sdb.Close() })
		sdb.SetMaxOpenConns(4)
		a := pgtest.Locker(t, pglease.SQL(sdb), table, "a", pglease.WithTTL(30*time.Second))
		c.armed.Store(true)
		_, err := a.Claim(ctx, "job")
		require.Error(t, err)
		require.Equal(t, int32(1), c.hits.Load(), "the claim ran on the server and its reply was lost")
		b := pgtest.Locker(t, pool, table, "b")
		deadline := time.Now().Add(3 * time.Second)
		for {
			_, err = b.Claim(ctx, "job")
			if err == nil || time.Now().After(deadline) {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
		row, _ := pgtest.ReadRow(t, pool, table, "job")
		require.NoError(t, err, "a claim that committed unseen was not given back: the row is live for %q until %v, and nobody holds it", row.Holder, row.ExpiresAt)
	})

	// Shows: an Elector on a Locker of SQL has one leader at a time: of two
	// Electors on the same key, one leads; when it closes, the other
	// takes over with a greater fence.
	for _, drv := range sqlDrivers {
		t.Run("ElectorOneLeader/"+drv, func(t *testing.T) {
			t.Parallel()
			ctx, _, table, _, db := sqlSetup(t, drv)
			la := pgtest.Locker(t, db, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
			lb := pgtest.Locker(t, db, table, "b", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
			ea, err := pglease.NewElector(la, "leader")
			require.NoError(t, err)
			eb, err := pglease.NewElector(lb, "leader")
			require.NoError(t, err)
			t.Cleanup(func() { _ = eb.Close(context.Background()) })
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			first, err := ea.Campaign(cctx)
			require.NoError(t, err)
			time.Sleep(500 * time.Millisecond)
			require.Error(t, eb.IsLeader(ctx), "two leaders at once")
			require.NoError(t, ea.Close(ctx))
			second, err := eb.Campaign(cctx)
			require.NoError(t, err)
			assert.Greater(t, second.Fence(), first.Fence())
			assert.Equal(t, lb.Holder(), second.Holder())
		})
	}
}
