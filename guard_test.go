package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// writeLedger appends lease's ledger row in tx, without guarding it.
func writeLedger(ctx context.Context, tx pgx.Tx, ledger string, lease *pglease.Lease) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, fence) VALUES ($1, $2, $3)`, ledger),
		lease.Key(), lease.Holder(), lease.Fence())
	return err
}

// guardedWrite appends one ledger row for lease in a new transaction, calls
// Guard last and commits; under -sqldb the transaction is a *sql.Tx,
// guarded by GuardSQL (pgtest.GuardedFunc).
func guardedWrite(ctx context.Context, db pglease.DB, ledger string, lease *pglease.Lease) error {
	return pgtest.GuardedFunc(ctx, db, lease, func(tx pgx.Tx) error {
		return writeLedger(ctx, tx, ledger, lease)
	})
}

// beginTx begins a transaction on db, rolled back at cleanup unless it
// ended before.
func beginTx(t *testing.T, db pglease.DB) pgx.Tx {
	t.Helper()
	tx, err := db.Begin(context.Background())
	require.NoError(t, err)
	t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

// guardedTx begins a transaction on db (as beginTx) whose first statement
// is lease's Guard.
func guardedTx(t *testing.T, db pglease.DB, lease *pglease.Lease) pgx.Tx {
	t.Helper()
	tx := beginTx(t, db)
	require.NoError(t, lease.Guard(context.Background(), tx))
	return tx
}

// rowLockedAgainstUpdate tells whether another transaction holds a lock on
// the lease row that a claim would wait for.
func rowLockedAgainstUpdate(t *testing.T, db pglease.DB, table, key string) bool {
	t.Helper()
	ctx := context.Background()
	tx, err := db.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = $1 FOR NO KEY UPDATE NOWAIT`, pgx.Identifier{table}.Sanitize()), key)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "55P03" { // lock_not_available
		return true
	}
	require.NoError(t, err)
	return false
}

// TestGuard pins Guard: a transaction commits only while its lease's
// mandate is the row's, and every failure leaves the transaction aborted.
//
// FailureAbortsWhateverEndedIt runs before its siblings: its cases share a
// table and run in turn.
func TestGuard(t *testing.T) {
	t.Parallel()
	// Guarantee: Guard and GuardSQL refuse a lease whose trust window only
	// heartbeat rounds cut short in their wait for a synchronous standby
	// would have moved: such a round extends nothing, so the lease is lost
	// at the deadline its last confirmed round set.
	t.Run("RefusesALeaseOnlyUnreplicatedRoundsExtended", testGuardUnreplicated)
	t.Run("CommitsWhileTheLeaseIsCurrent", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		l := pgtest.Locker(t, pool, table, "a")

		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, guardedWrite(ctx, pool, ledger, lease))
		require.NoError(t, guardedWrite(ctx, pool, ledger, lease), "a mandate may guard many transactions")
		assert.Len(t, pgtest.ReadLedger(t, pool, ledger), 2)
	})

	// A paused holder (its connection stalled as by SIGSTOP or a stalled link)
	// sends Guard before the pause; the bytes arrive after another replica
	// claimed the lapsed key. The commit must fail with ErrLost and write nothing.
	t.Run("PausedHoldersCommitFailsWithErrLost", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, admin)

		proxy := pgtest.Proxy(t, "")
		paused := pgtest.AppPool(t, "", proxy, pgtest.AppName("guard_paused"))
		a := pgtest.Locker(t, paused, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		b := pgtest.Locker(t, admin, table, "b", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))

		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		tx := pgtest.BeginTx(t, paused)
		require.NoError(t, writeLedger(ctx, tx, ledger, lease))

		proxy.SetMode(faultproxy.Stall)
		guarded := make(chan error, 1)
		go func() { guarded <- pgtest.Guard(ctx, lease, tx) }() // passes the local check, then waits in the proxy

		taken := pgtest.TakeOver(ctx, t, b, "job", lease, 10*time.Second)
		require.NoError(t, guardedWrite(ctx, admin, ledger, taken))

		proxy.SetMode(faultproxy.Forward)
		gerr := <-guarded
		require.ErrorIs(t, gerr, pglease.ErrLost)
		t.Logf("guard: %v", gerr)
		cerr := tx.Commit(ctx)
		require.Error(t, cerr, "a commit after a failed Guard must not succeed")
		t.Logf("commit: %v", cerr)

		entries := pgtest.ReadLedger(t, admin, ledger)
		require.Len(t, entries, 1)
		assert.Equal(t, b.Holder(), entries[0].Holder, "nothing of the paused mandate was written")
	})

	// A claim arriving while a guarded transaction is open waits for it, then
	// takes the key with a greater fence; the guarded writes come first. The
	// guarded mandate is past its expiry (and lost locally) by the time it
	// commits, and the commit is still safe: nobody could take the row meanwhile.
	t.Run("ClaimWaitsForTheGuardedTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		fa := pgtest.NewFaultyDB(pool)
		a := pgtest.Locker(t, fa, table, "a", pglease.WithTTL(500*time.Millisecond), pglease.WithHeartbeatInterval(100*time.Millisecond))
		b := pgtest.Locker(t, pool, table, "b")

		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		fa.SetFail("heartbeat", errors.New("paused")) // a stops extending: its row lapses while guarded
		tx := pgtest.BeginTx(t, pool)
		require.NoError(t, writeLedger(ctx, tx, ledger, lease))
		require.NoError(t, pgtest.Guard(ctx, lease, tx))

		pgtest.WaitDone(t, lease, 5*time.Second) // past its trust deadline, so past its server expiry soon after
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		var expired bool
		require.Eventually(t, func() bool {
			r, _ := pgtest.ReadRow(t, pool, table, "job")
			expired = !r.Live
			return expired
		}, 5*time.Second, 10*time.Millisecond)

		claimed := pgtest.ClaimInBackground(ctx, b, "job")
		pgtest.LockWaiter(t, pool, "", "INSERT INTO", 5*time.Second)
		select {
		case r := <-claimed:
			t.Fatalf("claim returned while the guarded transaction was open: %v", r.Err)
		default:
		}
		require.NoError(t, tx.Commit(ctx), "the guarded commit is safe: the row stayed locked")

		r := <-claimed
		require.NoError(t, r.Err)
		require.Greater(t, r.Lease.Fence(), lease.Fence())
		require.NoError(t, guardedWrite(ctx, pool, ledger, r.Lease))

		entries := pgtest.ReadLedger(t, pool, ledger)
		require.Len(t, entries, 2)
		assert.Equal(t, lease.Fence(), entries[0].Fence)
		assert.Equal(t, r.Lease.Fence(), entries[1].Fence)
	})

	t.Run("LeaseEndedLocallyNamesWhy", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a")

		first, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		second, err := l.Claim(ctx, "job") // re-entrant: first is lost
		require.NoError(t, err)
		third, err := l.Claim(ctx, "other")
		require.NoError(t, err)
		require.NoError(t, third.Unlock(ctx))

		err = first.Guard(ctx, beginTx(t, pool))
		require.ErrorIs(t, err, pglease.ErrLost)
		assert.Contains(t, err.Error(), "re-claimed by the same holder")
		err = third.Guard(ctx, beginTx(t, pool))
		require.ErrorIs(t, err, pglease.ErrLost, "a released mandate guards nothing")
		require.ErrorIs(t, err, pglease.ErrReleased)

		tx := beginTx(t, pool)
		require.NoError(t, second.Guard(ctx, tx))
		require.NoError(t, tx.Commit(ctx))
	})

	// Guarantee: Guard and GuardSQL name an operator's Revoke or
	// ForceExpire, as Unlock and the heartbeat do, even before the Locker
	// has seen it; neither claims another holder took the key.
	t.Run("NamesTheOperatorsAction", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			action string
			change func(*pglease.Admin, context.Context, string) (pglease.Revocation, error)
			says   string
		}{
			{"Revoke", (*pglease.Admin).Revoke, "revoked by an operator"},
			{"ForceExpire", (*pglease.Admin).ForceExpire, "expired early by an operator (Admin.ForceExpire)"},
		} {
			for _, via := range []string{"Guard", "GuardSQL"} {
				t.Run(c.action+"/"+via, func(t *testing.T) {
					t.Parallel()
					ctx, pool, table := pgtest.Setup(t)
					// No heartbeat round before Guard: the guard statement finds it.
					l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute))
					lease, err := l.Claim(ctx, "job")
					require.NoError(t, err)
					_, err = c.change(adminOf(t, pool, pglease.WithTable(table)), ctx, "job")
					require.NoError(t, err)
					// Two idle connections: the transaction takes one, and the
					// read of the refused row's reason the other, rather than
					// open one within the read's 250 ms on a loaded machine.
					var warm [2]*pgxpool.Conn
					for i := range warm {
						warm[i], err = pool.Acquire(ctx)
						require.NoError(t, err)
					}
					for _, w := range warm {
						w.Release()
					}

					if via == "Guard" {
						err = lease.Guard(ctx, beginTx(t, pool))
					} else {
						tx, berr := pgtest.OpenSQL(t, pool, "pgx").BeginTx(ctx, nil)
						require.NoError(t, berr)
						t.Cleanup(func() { _ = tx.Rollback() })
						err = lease.GuardSQL(ctx, tx)
					}
					t.Logf("%s after %s: %v", via, c.action, err)
					require.ErrorIs(t, err, pglease.ErrLost)
					assert.Equal(t, c.action == "Revoke", errors.Is(err, pglease.ErrRevoked))
					assert.Contains(t, err.Error(), c.says)
					assert.NotContains(t, err.Error(), "another holder")
				})
			}
		}
	})

	// Guarantee: a lease that lapsed with no other holder is not said to
	// be lost to one, by Err or by Guard.
	t.Run("LapsedLeaseClaimsNoOtherHolder", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		// Heartbeats skip a locked row: held until its trust deadline
		// passes, the lease lapses, and nobody else claims it.
		lock := beginTx(t, pool)
		_, err = lock.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR NO KEY UPDATE`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		require.NoError(t, lock.Rollback(ctx))

		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		assert.NotContains(t, lease.Err().Error(), "another holder")
		err = lease.Guard(ctx, beginTx(t, pool))
		t.Logf("Guard of a lapsed lease: %v", err)
		require.ErrorIs(t, err, pglease.ErrLost)
		assert.NotContains(t, err.Error(), "another holder")
	})

	t.Run("NilOrFinishedTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		err = lease.Guard(ctx, nil)
		require.ErrorContains(t, err, "tx is nil")
		err = lease.Guard(ctx, (*pgxpool.Tx)(nil))
		require.ErrorContains(t, err, "tx is nil")

		for _, end := range []string{"commit", "rollback"} {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			if end == "commit" {
				require.NoError(t, tx.Commit(ctx))
			} else {
				require.NoError(t, tx.Rollback(ctx))
			}
			err = lease.Guard(ctx, tx)
			require.ErrorIs(t, err, pgx.ErrTxClosed, end)
			require.ErrorContains(t, err, "already been committed or rolled back", end)
		}

		tx := beginTx(t, pool)
		_, err = tx.Exec(ctx, `SELECT 1 / 0`)
		require.Error(t, err)
		err = lease.Guard(ctx, tx)
		require.ErrorContains(t, err, "aborted by an earlier error")
		require.NotErrorIs(t, err, pglease.ErrLost)
		require.NoError(t, lease.Err(), "a failed transaction says nothing about the lease")
	})

	// Guarantee: "tx is nil" is named for a nil pgx.Tx; a wrapper around a nil
	// transaction should be an error too, not a panic deep in Guard.
	t.Run("WrappedNilTransaction", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		require.NoError(t, err)
		var gerr error
		require.NotPanics(t, func() { gerr = lease.Guard(ctx, wrappedTx{}) })
		require.Error(t, gerr)
		require.NotErrorIs(t, gerr, pglease.ErrLost)
	})

	// Row locks taken in a savepoint that is rolled back are released: a Guard
	// there protects nothing. A released savepoint keeps the lock until the
	// outer transaction ends.
	t.Run("RolledBackSavepointUnlocksTheRow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		for _, end := range []string{"rollback", "release"} {
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			nested, err := tx.Begin(ctx) // SAVEPOINT
			require.NoError(t, err)
			require.NoError(t, lease.Guard(ctx, nested))
			require.True(t, rowLockedAgainstUpdate(t, pool, table, "job"), end)
			if end == "rollback" {
				require.NoError(t, nested.Rollback(ctx))
				assert.False(t, rowLockedAgainstUpdate(t, pool, table, "job"), "ROLLBACK TO SAVEPOINT dropped the guard")
			} else {
				require.NoError(t, nested.Commit(ctx)) // RELEASE SAVEPOINT
				assert.True(t, rowLockedAgainstUpdate(t, pool, table, "job"), "RELEASE SAVEPOINT keeps the guard")
			}
			require.NoError(t, tx.Rollback(ctx))
			assert.False(t, rowLockedAgainstUpdate(t, pool, table, "job"))
		}
	})

	// Guarantee: the guard survives a lock upgrade on the lease row in a
	// savepoint that is rolled back (PostgreSQL before 9.3 dropped the share
	// lock then).
	t.Run("SurvivesARolledBackForUpdate", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		tx := guardedTx(t, pool, lease)
		sp, err := tx.Begin(ctx)
		require.NoError(t, err)
		_, err = sp.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR UPDATE`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)
		_, err = sp.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = holder WHERE key = 'job'`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)
		require.NoError(t, sp.Rollback(ctx))
		assert.True(t, rowLockedAgainstUpdate(t, pool, table, "job"), "the guard's share lock is gone after ROLLBACK TO SAVEPOINT")
	})

	// Under REPEATABLE READ, a heartbeat that extended the row after the
	// transaction's snapshot makes Guard fail with SQLSTATE 40001, not ErrLost:
	// the mandate is current, the transaction is to be retried. Guard as the
	// transaction's first statement takes the snapshot and the lock together.
	t.Run("RepeatableReadAfterAHeartbeat", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
			tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // a failed check leaves no transaction open
			require.NoError(t, writeLedger(ctx, tx, ledger, lease))     // the snapshot is taken here
			// A heartbeat round commits after the snapshot: the row read
			// outside it has moved past the one the snapshot sees.
			seen, ok := pgtest.ReadRow(t, tx, table, "job")
			require.True(t, ok)
			require.Eventually(t, func() bool {
				now, ok := pgtest.ReadRow(t, pool, table, "job")
				return ok && now.ExpiresAt.After(seen.ExpiresAt)
			}, 5*time.Second, 10*time.Millisecond, "no heartbeat round committed after the snapshot")
			err = lease.Guard(ctx, tx)
			var pgErr *pgconn.PgError
			require.ErrorAs(t, err, &pgErr, iso)
			assert.Equal(t, "40001", pgErr.Code, iso)
			require.NotErrorIs(t, err, pglease.ErrLost, iso)
			require.ErrorContains(t, err, "retry the transaction", iso)
			require.NoError(t, tx.Rollback(ctx))
			require.NoError(t, lease.Err())

			// Retried with Guard first: snapshot and lock in one statement, so
			// no heartbeat can commit in between. It may still meet a heartbeat
			// in flight, which is again a 40001 to retry.
			require.Eventually(t, func() bool {
				err := pgx.BeginTxFunc(ctx, pool, pgx.TxOptions{IsoLevel: iso}, func(tx pgx.Tx) error {
					if err := lease.Guard(ctx, tx); err != nil {
						return err
					}
					return writeLedger(ctx, tx, ledger, lease)
				})
				return err == nil
			}, 5*time.Second, time.Millisecond, iso)
		}
		assert.Len(t, pgtest.ReadLedger(t, pool, ledger), 2)
	})

	t.Run("WithoutFenceColumn", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		admin := pgtest.Pool(t, nil)
		ledger := pgtest.NewLedger(t, admin)
		_, err := admin.Exec(ctx, fmt.Sprintf(`GRANT INSERT, SELECT ON %s TO PUBLIC; GRANT USAGE ON SEQUENCE %s_id_seq TO PUBLIC`, ledger, ledger))
		require.NoError(t, err)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn())

		first, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, guardedWrite(ctx, pool, ledger, first))

		// A claim of the same holder that l never saw (another Locker storing
		// its holder) re-claims the key: the row now carries another forged
		// holder, though the prefix is the same.
		other := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn(), pglease.StoredHolder(l.Holder()))
		second, err := other.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, first.Err(), "first's Locker has not noticed yet")
		err = guardedWrite(ctx, pool, ledger, first)
		require.ErrorIs(t, err, pglease.ErrLost)
		require.NoError(t, guardedWrite(ctx, pool, ledger, second))

		entries := pgtest.ReadLedger(t, admin, ledger)
		require.Len(t, entries, 2)
		assert.Equal(t, []string{first.Holder(), second.Holder()}, []string{entries[0].Holder, entries[1].Holder})
	})

	t.Run("ElectorsLeadership", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		e := newElector(t, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet)})

		require.NoError(t, e.IsLeader(ctx))
		leader, ok := e.Leader()
		require.True(t, ok)
		require.NoError(t, guardedWrite(ctx, pool, ledger, leader))
		require.NoError(t, e.Close(ctx))
		err := guardedWrite(ctx, pool, ledger, leader)
		require.ErrorIs(t, err, pglease.ErrLost, "a leader that resigned guards nothing")
		assert.Len(t, pgtest.ReadLedger(t, pool, ledger), 1)
	})

	// A guarded transaction holds the lease row, and so this holder's own
	// heartbeat of that row, until it ends. Held for less than the trust window
	// left (TTL - margin since the last heartbeat, at worst TTL - margin -
	// interval), the lease survives; held longer, the lease is lost locally,
	// and the commit is still safe: the row stayed locked, so no later mandate
	// could begin. The figures (how long the heartbeat was held back) are logged.
	t.Run("HeldLongLosesOnlyLocally", func(t *testing.T) {
		t.Parallel()
		const (
			ttl      = 2 * time.Second
			interval = 400 * time.Millisecond
		)
		for _, hold := range []time.Duration{interval, ttl + interval} {
			t.Run(hold.String(), func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				ledger := pgtest.NewLedger(t, pool)
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook))
				lease, err := l.Claim(ctx, "job")
				require.NoError(t, err)
				events.WaitFor(t, pglease.EventExtended, 5*time.Second) // the hold starts right after a heartbeat

				tx := beginTx(t, pool)
				require.NoError(t, writeLedger(ctx, tx, ledger, lease))
				require.NoError(t, lease.Guard(ctx, tx))
				guarded := time.Now()
				select {
				case <-lease.Done():
				case <-time.After(hold): // the job's transaction stays open this long
				}
				require.NoError(t, tx.Commit(ctx), "a guarded commit is safe even past the lease's trust window")
				committed := time.Since(guarded)

				if hold < ttl-interval {
					ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second)
					require.NoError(t, lease.Err(), "a short guard costs the lease nothing")
					t.Logf("figures: guard held %v: lease kept; the heartbeat after it took %v", committed.Round(time.Millisecond), ev.Took.Round(time.Millisecond))
					return
				}
				require.ErrorIs(t, lease.Err(), pglease.ErrLost)
				t.Logf("figures: guard held %v (TTL %v, interval %v): lease lost locally, %v after the hold began; the commit went through",
					committed.Round(time.Millisecond), ttl, interval, committed.Round(time.Millisecond))
				r, ok := pgtest.ReadRow(t, pool, table, "job")
				require.True(t, ok)
				assert.Equal(t, lease.Fence(), r.Fence, "nobody took the row while it was guarded")
			})
		}
	})

	// Guarantee: every failure of Guard leaves its transaction aborted, so that
	// a caller who ignores the error and commits writes nothing, whatever the
	// reason was found: a lease the Locker already knows has ended (lost at a
	// heartbeat, released, or its Locker closed) fails without asking the
	// server, and must abort the transaction all the same.
	t.Run("FailureAbortsWhateverItFound", func(t *testing.T) {
		t.Parallel()
		ended := map[string]func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string, l *pglease.Locker, lease *pglease.Lease){
			"LostAtAHeartbeat": func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string, _ *pglease.Locker, lease *pglease.Lease) {
				t.Helper()
				_, err := adminOf(t, pool, pglease.WithTable(table)).ForceExpire(ctx, lease.Key())
				require.NoError(t, err)
				pgtest.WaitDone(t, lease, 10*time.Second)
			},
			"Released": func(ctx context.Context, t *testing.T, _ *pgxpool.Pool, _ string, _ *pglease.Locker, lease *pglease.Lease) {
				t.Helper()
				require.NoError(t, lease.Unlock(ctx))
			},
			"LockerClosed": func(ctx context.Context, t *testing.T, _ *pgxpool.Pool, _ string, l *pglease.Locker, _ *pglease.Lease) {
				t.Helper()
				require.NoError(t, l.Close(ctx))
			},
		}
		for name, end := range ended {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				ledger := pgtest.NewLedger(t, pool)
				l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(3*time.Second))
				lease, err := l.Claim(ctx, "job")
				require.NoError(t, err)
				end(ctx, t, pool, table, l, lease)
				require.Error(t, lease.Err())

				tx := beginTx(t, pool)
				require.NoError(t, writeLedger(ctx, tx, ledger, lease))
				err = lease.Guard(ctx, tx)
				require.ErrorIs(t, err, pglease.ErrLost)
				// A careless caller commits anyway.
				commitErr := tx.Commit(ctx)
				assert.Empty(t, pgtest.ReadLedger(t, pool, ledger),
					"the guarded write of an ended lease committed (Commit returned %v)", commitErr)
			})
		}
	})

	// Guarantee: every failure of Guard leaves its transaction aborted, also
	// when its context ends while the guard statement waits on the row lock,
	// and when Guard runs in a pgx nested transaction whose savepoint the
	// caller then releases.
	t.Run("FailureAbortsWhateverEndedIt", func(t *testing.T) {
		// Its cases share a table and run in turn.
		ctx, pool, table := pgtest.Setup(t)
		_, err := pool.Exec(ctx, `CREATE TABLE `+pgx.Identifier{table + "_w"}.Sanitize()+` (v int)`)
		require.NoError(t, err)
		insert := `INSERT INTO ` + pgx.Identifier{table + "_w"}.Sanitize() + ` VALUES (1)`
		count := func() int {
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table + "_w"}.Sanitize()).Scan(&n))
			return n
		}
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(10*time.Second))

		t.Run("ContextEndsOnTheRowLock", func(t *testing.T) {
			lease, err := a.Claim(ctx, "lockwait")
			require.NoError(t, err)
			defer func() { _ = lease.Unlock(ctx) }()
			blocker := pgtest.LockRows(t, pool, table, "key = $1", "lockwait")
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, insert)
			require.NoError(t, err)
			gctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			defer cancel()
			err = lease.Guard(gctx, tx)
			require.Error(t, err)
			require.NoError(t, blocker.Rollback(ctx))
			if cerr := tx.Commit(ctx); cerr == nil {
				t.Fatalf("a Guard that failed (%v) left a transaction that commits", err)
			}
			require.Equal(t, 0, count())
		})

		t.Run("ContextAlreadyEnded", func(t *testing.T) {
			lease, err := a.Claim(ctx, "ended")
			require.NoError(t, err)
			defer func() { _ = lease.Unlock(ctx) }()
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, insert)
			require.NoError(t, err)
			gctx, cancel := context.WithCancel(ctx)
			cancel()
			require.Error(t, lease.Guard(gctx, tx))
			require.Error(t, tx.Commit(ctx), "a Guard with an ended context left a transaction that commits")
			require.Equal(t, 0, count())
		})

		t.Run("NestedSavepointReleased", func(t *testing.T) {
			lease, err := a.Claim(ctx, "nested")
			require.NoError(t, err)
			_, err = a.Claim(ctx, "nested") // re-entrant: lease is now an old mandate
			require.NoError(t, err)
			require.Error(t, lease.Err())
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			_, err = tx.Exec(ctx, insert)
			require.NoError(t, err)
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			require.ErrorIs(t, lease.Guard(ctx, sp), pglease.ErrLost)
			_ = sp.Commit(ctx) // the careless caller releases the savepoint
			require.Error(t, tx.Commit(ctx), "an old mandate's transaction committed after its failed Guard")
			require.Equal(t, 0, count())
		})

		t.Run("OldLeaseNeverCommitsAfterANewerClaim", func(t *testing.T) {
			lease, err := a.Claim(ctx, "race")
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			defer func() { _ = tx.Rollback(ctx) }()
			sp, err := tx.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, lease.Guard(ctx, sp))
			require.NoError(t, sp.Commit(ctx)) // released savepoint: its lock stays with tx
			reclaimed := make(chan int64, 1)
			go func() {
				ls, err := a.Claim(ctx, "race")
				if err != nil {
					reclaimed <- -1
					return
				}
				reclaimed <- ls.Fence()
			}()
			select {
			case f := <-reclaimed:
				t.Fatalf("a newer claim (fence %d) returned while the old mandate's guarded transaction was open", f)
			case <-time.After(300 * time.Millisecond):
			}
			_, err = tx.Exec(ctx, insert)
			require.NoError(t, err)
			require.NoError(t, tx.Commit(ctx))
			require.Greater(t, <-reclaimed, lease.Fence())
		})
	})

	// Guarantee: "tx is then aborted: its commit can only roll back even if the
	// caller ignores Guard's error", in the outermost transaction, even when
	// the caller goes on writing after the ignored error. (A savepoint rolled
	// back after the failed Guard would undo the abort: Guard's documentation
	// says to call it in the outermost transaction.)
	t.Run("IgnoredFailureStillAbortsTheCommit", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		a1 := pgtest.Locker(t, pool, table, "a")
		a2 := pgtest.Locker(t, pool, table, "a", pglease.StoredHolder(a1.Holder()))

		first, err := a1.Claim(ctx, "job")
		require.NoError(t, err)
		tx := beginTx(t, pool)
		require.NoError(t, writeLedger(ctx, tx, ledger, first))

		later, err := a2.Claim(ctx, "job") // takes the key over
		require.NoError(t, err)
		require.NoError(t, guardedWrite(ctx, pool, ledger, later))

		gerr := first.Guard(ctx, tx)
		require.ErrorIs(t, gerr, pglease.ErrLost)
		t.Logf("guard (ignored by the caller): %v", gerr)
		require.Error(t, writeLedger(ctx, tx, ledger, first), "a write after the failed Guard went through")
		cerr := tx.Commit(ctx)
		require.Error(t, cerr, "the outer transaction of a failed Guard committed")

		for _, e := range pgtest.ReadLedger(t, pool, ledger) {
			assert.NotEqual(t, first.Fence(), e.Fence, "a write of fence %d landed after fence %d's", first.Fence(), later.Fence())
		}
	})

	// Guarantee: a failed Guard leaves no transaction that can commit even
	// when its connection is busy with a result set the caller still holds
	// open, so that neither the guard statement nor the refusal can be sent
	// on it: the lease ended locally (no statement sent) or was taken over on
	// the server (the guard statement fails too). Guard then closes the
	// connection under tx and says so; the stale write never lands.
	t.Run("FailureLeavesNoCommittableTransactionOnABusyConnection", func(t *testing.T) {
		t.Parallel()
		for _, locally := range []bool{true, false} {
			t.Run(map[bool]string{true: "EndedLocally", false: "TakenOverOnTheServer"}[locally], func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				ledger := pgtest.NewLedger(t, pool)
				a1 := pgtest.Locker(t, pool, table, "a")
				// A later mandate of a1's holder that a1 never saw.
				a2 := pgtest.Locker(t, pool, table, "a", pglease.StoredHolder(a1.Holder()))
				first, err := a1.Claim(ctx, "job")
				require.NoError(t, err)
				if locally {
					require.NoError(t, first.Unlock(ctx))
				}
				later, err := a2.Claim(ctx, "job") // takes the key over
				require.NoError(t, err)

				tx := beginTx(t, pool)
				require.NoError(t, writeLedger(ctx, tx, ledger, first))
				rows, err := tx.Query(ctx, `SELECT generate_series(1, 10000)`)
				require.NoError(t, err)
				require.True(t, rows.Next(), "the result set is open")
				gerr := first.Guard(ctx, tx)
				require.Error(t, gerr)
				if locally {
					require.ErrorIs(t, gerr, pglease.ErrLost)
				}
				t.Logf("guard: %v", gerr)
				require.ErrorContains(t, gerr, "closed the connection")
				rows.Close()
				cerr := tx.Commit(ctx) // a careless caller commits anyway
				require.Error(t, cerr, "the transaction of a failed Guard committed")

				require.NoError(t, guardedWrite(ctx, pool, ledger, later))
				for _, e := range pgtest.ReadLedger(t, pool, ledger) {
					assert.NotEqual(t, first.Fence(), e.Fence, "a write of fence %d landed after fence %d's", first.Fence(), later.Fence())
				}
			})
		}
	})

	// Guarantee: a Guard cancelled by its context while it waits on the row
	// lock of a claim in flight must not leave a transaction that commits.
	t.Run("CancelledWaitLeavesNothingToCommit", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ledger := pgtest.NewLedger(t, pool)
		l := pgtest.Locker(t, pool, table, "a")
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		claimInFlight, err := pool.Begin(ctx) // as a claim holds the row before it commits
		require.NoError(t, err)
		defer func() { _ = claimInFlight.Rollback(ctx) }()
		_, err = claimInFlight.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR NO KEY UPDATE`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)

		tx := beginTx(t, pool)
		require.NoError(t, writeLedger(ctx, tx, ledger, lease))
		gctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		gerr := lease.Guard(gctx, tx)
		cancel()
		require.Error(t, gerr)
		t.Logf("guard: %v", gerr)
		cerr := tx.Commit(ctx)
		t.Logf("commit: %v", cerr)
		require.Error(t, cerr)
		require.NoError(t, claimInFlight.Rollback(ctx))
		assert.Empty(t, pgtest.ReadLedger(t, pool, ledger))
	})

	// Guarantee: "checks that this mandate is still the row's". The statement
	// names the lease table without its schema, so it resolves it on the
	// caller's connection, whose search_path may differ from the Locker's (a
	// schema-per-tenant application sets it per transaction). There another
	// table of that name, with its own fence sequence, can hold a row with the
	// same key, holder and fence: Guard then approves a mandate its own table
	// has already handed to a later one.
	t.Run("IgnoresTheSearchPath", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		admin := pgtest.Pool(t, nil)
		s1, s2 := pgtest.Name("tenant_a"), pgtest.Name("tenant_b")
		for _, s := range []string{s1, s2} {
			_, err := admin.Exec(ctx, "CREATE SCHEMA "+s)
			require.NoError(t, err)
			t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+s+" CASCADE") })
		}
		onPath := func(schema string) *pgxpool.Pool {
			pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["search_path"] = schema })
			require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable("lease")))
			return pool
		}
		poolA, poolB := onPath(s1), onPath(s2)

		// Tenant A: a's mandate, then a later one of the same holder (another
		// Locker storing it: a re-entrant claim with a new fence).
		svc := pgtest.Locker(t, poolA, "lease", "svc")
		first, err := svc.Claim(ctx, "job")
		require.NoError(t, err)
		later, err := pgtest.Locker(t, poolA, "lease", "svc", pglease.StoredHolder(svc.Holder())).Claim(ctx, "job")
		require.NoError(t, err)
		require.Greater(t, later.Fence(), first.Fence())

		// Tenant B: the same service holds the same key, fence from its own
		// sequence.
		tenantB, err := pgtest.Locker(t, poolB, "lease", "svc", pglease.StoredHolder(svc.Holder())).Claim(ctx, "job")
		require.NoError(t, err)
		require.Equal(t, first.Fence(), tenantB.Fence(), "both sequences start at 1")

		txA, err := poolA.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, first.Guard(ctx, txA), pglease.ErrLost, "on the Locker's own table")
		require.NoError(t, txA.Rollback(ctx))

		txB, err := poolB.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = txB.Rollback(ctx) }()
		err = first.Guard(ctx, txB)
		assert.Error(t, err, "Guard approved a mandate that its own table handed to fence %d, by reading another schema's table", later.Fence())
	})

	// Guarantee: Guard through PgBouncer in transaction mode, in every exec
	// mode the library supports there: it guards, and it refuses a lost
	// mandate.
	t.Run("ThroughPgBouncer", func(t *testing.T) {
		t.Parallel()
		for _, m := range bouncerModes(t) {
			t.Run(m.name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				b := pgbouncer.New(t, pgtest.Server.DSN(), m.opts)
				pool := bouncedPool(t, b, m.mode)
				admin := pgtest.Pool(t, nil)
				table := pgtest.Table(t, admin)
				ledger := pgtest.NewLedger(t, admin)
				a1 := pgtest.Locker(t, pool, table, "a")
				a2 := pgtest.Locker(t, pool, table, "a", pglease.StoredHolder(a1.Holder()))
				first, err := a1.Claim(ctx, "job")
				require.NoError(t, err)
				require.NoError(t, guardedWrite(ctx, pool, ledger, first))
				tx := guardedTx(t, pool, first)
				require.True(t, rowLockedAgainstUpdate(t, admin, table, "job"))
				require.NoError(t, tx.Commit(ctx))
				later, err := a2.Claim(ctx, "job")
				require.NoError(t, err)
				require.ErrorIs(t, guardedWrite(ctx, pool, ledger, first), pglease.ErrLost)
				require.NoError(t, guardedWrite(ctx, pool, ledger, later))
				assert.Len(t, pgtest.ReadLedger(t, admin, ledger), 2)
			})
		}
	})

	// Guarantee: "no claim can take the key over before that transaction commits
	// or rolls back" for a guarded transaction prepared for two-phase commit,
	// across a crash of the server: the prepared transaction and its row lock
	// must outlive the restart, so that no claim takes the key until COMMIT
	// PREPARED, and the guarded write lands before the later mandate's.
	t.Run("PreparedKeepsTheKeyAcrossACrash", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		srv, err := pgserver.Start(ctx, pgserver.Options{Private: true, Durable: true})
		require.NoError(t, err)
		t.Cleanup(func() { _ = srv.Close() })
		admin := pgtest.PoolAt(t, srv.DSN(), nil)
		_, err = admin.Exec(ctx, `ALTER SYSTEM SET max_prepared_transactions = 4`)
		require.NoError(t, err)
		admin.Close()
		require.NoError(t, srv.Restart(ctx, pgserver.Fast))

		pool := pgtest.PoolAt(t, srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		ledger := pgtest.NewLedger(t, pool)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)

		tx := beginTx(t, pool)
		require.NoError(t, writeLedger(ctx, tx, ledger, lease))
		require.NoError(t, lease.Guard(ctx, tx))
		_, err = tx.Exec(ctx, `PREPARE TRANSACTION 'guarded'`)
		require.NoError(t, err)
		_ = tx.Rollback(ctx) // the session's transaction is over; the prepared one lives on

		require.NoError(t, srv.Restart(ctx, pgserver.Immediate))
		pool2 := pgtest.PoolAt(t, srv.DSN(), nil)
		b := pgtest.Locker(t, pool2, table, "b")

		// Once a's row has lapsed (TTL 1s, nobody could extend it across the
		// crash), b must still wait for the prepared guard.
		pgtest.WaitExpired(t, pool2, table, "job", 10*time.Second)
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		_, err = b.Claim(cctx, "job")
		cancel()
		require.Error(t, err, "a claim took the key while a prepared guarded transaction was pending")
		t.Logf("claim while prepared: %v", err)

		_, err = pool2.Exec(ctx, `COMMIT PREPARED 'guarded'`)
		require.NoError(t, err)
		later, err := b.Claim(ctx, "job")
		require.NoError(t, err)
		require.Greater(t, later.Fence(), lease.Fence())
		require.NoError(t, guardedWrite(ctx, pool2, ledger, later))
		entries := pgtest.ReadLedger(t, pool2, ledger)
		require.Len(t, entries, 2)
		assert.Equal(t, []int64{lease.Fence(), later.Fence()}, []int64{entries[0].Fence, entries[1].Fence})
	})
}

// wrappedTx is an application's own pgx.Tx wrapper (tracing, metrics).
type wrappedTx struct{ pgx.Tx }

func testGuardUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	const ttl, interval = 3 * time.Second, 1400 * time.Millisecond
	var (
		mu   sync.Mutex
		last time.Time // when the last round that came back was sent
	)
	hook := func(e pglease.Event) {
		if e.Kind == pglease.EventExtended && e.Leases > 0 {
			mu.Lock()
			last = time.Now().Add(-e.Took)
			mu.Unlock()
		}
	}
	l := pgtest.Locker(t, pgtest.CancelRequestPool(t, srv.DSN(), nil), table, "a",
		pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(hook))
	// A lease of a longer TTL beside one of the Locker's: a round gives up
	// at the earlier trust deadline, and still has this lease to extend.
	long, err := l.Job(pglease.WithTTL(2 * ttl))
	require.NoError(t, err)
	_, err = l.Claim(ctx, "short")
	require.NoError(t, err)
	mu.Lock()
	last = time.Now()
	mu.Unlock()
	lease, err := long.Claim(ctx, "long")
	require.NoError(t, err)
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	// The last confirmed round (or the claim) was sent before the standby
	// vanished: the lease is trusted until 2*ttl after it at most. A round
	// cut short, sent an interval later, would move that by most of an
	// interval.
	mu.Lock()
	trusted := last.Add(2*ttl + 200*time.Millisecond)
	mu.Unlock()
	select {
	case <-lease.Done():
	case <-time.After(time.Until(trusted)):
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	require.ErrorIs(t, lease.Guard(ctx, tx), pglease.ErrLost, "Guard")
	for _, driver := range []string{"pgx", "pq"} {
		stx, err := pgtest.OpenSQL(t, pool, driver).BeginTx(ctx, nil)
		require.NoError(t, err)
		require.ErrorIs(t, lease.GuardSQL(ctx, stx), pglease.ErrLost, "GuardSQL on %s", driver)
		require.Error(t, stx.Commit(), "GuardSQL on %s: a refused transaction cannot commit", driver)
	}
}
