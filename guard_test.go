package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// newLedger creates a ledger table beside a lease table: one row per guarded
// write, in commit-independent insertion order (id).
func newLedger(tb testing.TB, db pglease.DB) string {
	tb.Helper()
	name := pgtest.Name("ledger")
	_, err := db.Exec(context.Background(), fmt.Sprintf(`CREATE TABLE %s (
		id bigserial PRIMARY KEY, key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL,
		at timestamptz NOT NULL DEFAULT clock_timestamp())`, name))
	require.NoError(tb, err)
	return name
}

// ledgerEntry is one row of a ledger table.
type ledgerEntry struct {
	id     int64
	key    string
	holder string
	fence  int64
	token  string // only in a commit-ordered ledger (commitOrderedLedgerDDL)
}

// readLedger reads every row of a ledger of newLedger, in insertion order.
func readLedger(t *testing.T, db pglease.DB, ledger string) []ledgerEntry {
	t.Helper()
	return queryLedger(t, db, fmt.Sprintf(`SELECT id, key, holder, fence, '' FROM %s ORDER BY id`, ledger))
}

// queryLedger reads the ledger entries query selects: id, key, holder,
// fence and token, in that order.
func queryLedger(t *testing.T, db pglease.DB, query string) []ledgerEntry {
	t.Helper()
	rows, err := db.Query(context.Background(), query)
	require.NoError(t, err)
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (ledgerEntry, error) {
		var e ledgerEntry
		return e, r.Scan(&e.id, &e.key, &e.holder, &e.fence, &e.token)
	})
	require.NoError(t, err)
	return out
}

// writeLedger appends lease's ledger row in tx, without guarding it.
func writeLedger(ctx context.Context, tx pgx.Tx, ledger string, lease *pglease.Lease) error {
	_, err := tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, fence) VALUES ($1, $2, $3)`, ledger),
		lease.Key(), lease.Holder(), lease.Fence())
	return err
}

// guardedWrite appends one ledger row for lease in a new transaction, calls
// Guard last and commits.
func guardedWrite(ctx context.Context, db pglease.DB, ledger string, lease *pglease.Lease) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if err := writeLedger(ctx, tx, ledger, lease); err != nil {
			return err
		}
		return lease.Guard(ctx, tx)
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

// waitLockWait waits until a backend waits on a row lock while running a
// statement that contains fragment.
func waitLockWait(t *testing.T, db pglease.DB, fragment string, limit time.Duration) {
	t.Helper()
	deadline := time.Now().Add(limit)
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for {
		var n int
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, fragment).Scan(&n))
		if n > 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no statement containing %q waits on a lock after %v", fragment, limit)
		}
		<-tick.C
	}
}

func TestGuardedTransactionCommitsWhileTheMandateIsCurrent(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	l := pgtest.Locker(t, pool, table, "a")

	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, pool, ledger, lease))
	require.NoError(t, guardedWrite(ctx, pool, ledger, lease), "a mandate may guard many transactions")
	assert.Len(t, readLedger(t, pool, ledger), 2)
}

// A paused holder (its connection stalled as by SIGSTOP or a stalled link)
// sends Guard before the pause; the bytes arrive after another replica
// claimed the lapsed key. The commit must fail with ErrLost and write nothing.
func TestPausedHoldersGuardedCommitAfterAnotherClaimFailsWithErrLostAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx, admin, table := pgtest.Setup(t)
	ledger := newLedger(t, admin)

	proxy := newProxy(t, "")
	paused := appPool(t, "", proxy, appName("guard_paused"))
	a := pgtest.Locker(t, paused, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
	b := pgtest.Locker(t, admin, table, "b", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))

	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	tx := beginTx(t, paused)
	require.NoError(t, writeLedger(ctx, tx, ledger, lease))

	proxy.SetMode(faultproxy.Stall)
	guarded := make(chan error, 1)
	go func() { guarded <- lease.Guard(ctx, tx) }() // passes the local check, then waits in the proxy

	taken := takeOverFrom(ctx, t, b, "job", lease, 10*time.Second)
	require.NoError(t, guardedWrite(ctx, admin, ledger, taken))

	proxy.SetMode(faultproxy.Forward)
	gerr := <-guarded
	require.ErrorIs(t, gerr, pglease.ErrLost)
	t.Logf("guard: %v", gerr)
	cerr := tx.Commit(ctx)
	require.Error(t, cerr, "a commit after a failed Guard must not succeed")
	t.Logf("commit: %v", cerr)

	entries := readLedger(t, admin, ledger)
	require.Len(t, entries, 1)
	assert.Equal(t, "b", entries[0].holder, "nothing of the paused mandate was written")
}

// A claim arriving while a guarded transaction is open waits for it, then
// takes the key with a greater fence; the guarded writes come first. The
// guarded mandate is past its expiry (and lost locally) by the time it
// commits, and the commit is still safe: nobody could take the row meanwhile.
func TestClaimWaitsForAnOpenGuardedTransactionThenSucceedsWithAGreaterFence(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	fa := pgtest.NewFaultyDB(pool)
	a := pgtest.Locker(t, fa, table, "a", pglease.WithTTL(500*time.Millisecond), pglease.WithHeartbeatInterval(100*time.Millisecond))
	b := pgtest.Locker(t, pool, table, "b")

	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	fa.SetFail("heartbeat", errors.New("paused")) // a stops extending: its row lapses while guarded
	tx := beginTx(t, pool)
	require.NoError(t, writeLedger(ctx, tx, ledger, lease))
	require.NoError(t, lease.Guard(ctx, tx))

	pgtest.WaitDone(t, lease, 5*time.Second) // past its trust deadline, so past its server expiry soon after
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	var expired bool
	require.Eventually(t, func() bool {
		r, _ := pgtest.ReadRow(t, pool, table, "job")
		expired = !r.Live
		return expired
	}, 5*time.Second, 10*time.Millisecond)

	type result struct {
		lease *pglease.Lease
		err   error
	}
	claimed := make(chan result, 1)
	go func() {
		ls, err := b.Claim(ctx, "job")
		claimed <- result{ls, err}
	}()
	waitLockWait(t, pool, "INSERT INTO", 5*time.Second)
	select {
	case r := <-claimed:
		t.Fatalf("claim returned while the guarded transaction was open: %v", r.err)
	default:
	}
	require.NoError(t, tx.Commit(ctx), "the guarded commit is safe: the row stayed locked")

	r := <-claimed
	require.NoError(t, r.err)
	require.Greater(t, r.lease.Fence(), lease.Fence())
	require.NoError(t, guardedWrite(ctx, pool, ledger, r.lease))

	entries := readLedger(t, pool, ledger)
	require.Len(t, entries, 2)
	assert.Equal(t, lease.Fence(), entries[0].fence)
	assert.Equal(t, r.lease.Fence(), entries[1].fence)
}

func TestGuardOnALeaseEndedLocallyReturnsErrLostNamingWhyItEnded(t *testing.T) {
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
}

func TestGuardWithANilOrFinishedTransactionNamesTheProblem(t *testing.T) {
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

// Row locks taken in a savepoint that is rolled back are released: a Guard
// there protects nothing. A released savepoint keeps the lock until the
// outer transaction ends.
func TestGuardInARolledBackSavepointNoLongerLocksTheRowButAReleasedOneDoes(t *testing.T) {
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
}

// Under REPEATABLE READ, a heartbeat that extended the row after the
// transaction's snapshot makes Guard fail with SQLSTATE 40001, not ErrLost:
// the mandate is current, the transaction is to be retried. Guard as the
// transaction's first statement takes the snapshot and the lock together.
func TestGuardUnderRepeatableReadAfterAHeartbeatIsASerializationFailureNotALoss(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond),
		pglease.WithHook(events.Hook))
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)

	for _, iso := range []pgx.TxIsoLevel{pgx.RepeatableRead, pgx.Serializable} {
		tx, err := pool.BeginTx(ctx, pgx.TxOptions{IsoLevel: iso})
		require.NoError(t, err)
		require.NoError(t, writeLedger(ctx, tx, ledger, lease)) // the snapshot is taken here
		events.WaitFor(t, pglease.EventExtended, 5*time.Second)
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
	assert.Len(t, readLedger(t, pool, ledger), 2)
}

func TestGuardWithoutFenceColumnMatchesTheForgedHolderOfTheMandate(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	admin := pgtest.Pool(t, nil)
	ledger := newLedger(t, admin)
	_, err := admin.Exec(ctx, fmt.Sprintf(`GRANT INSERT, SELECT ON %s TO PUBLIC; GRANT USAGE ON SEQUENCE %s_id_seq TO PUBLIC`, ledger, ledger))
	require.NoError(t, err)
	l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn())

	first, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, guardedWrite(ctx, pool, ledger, first))

	// A second Locker of the same replica re-claims the key: the row now
	// carries another forged holder, though the replica prefix is the same.
	other := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn())
	second, err := other.Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, first.Err(), "first's Locker has not noticed yet")
	err = guardedWrite(ctx, pool, ledger, first)
	require.ErrorIs(t, err, pglease.ErrLost)
	require.NoError(t, guardedWrite(ctx, pool, ledger, second))

	entries := readLedger(t, admin, ledger)
	require.Len(t, entries, 2)
	assert.Equal(t, []string{first.Holder(), second.Holder()}, []string{entries[0].holder, entries[1].holder})
}

func TestGuardOnTheElectorsLeadershipLease(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ledger := newLedger(t, pool)
	e := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet))
	t.Cleanup(func() { _ = e.Close(context.Background()) })

	require.NoError(t, e.IsLeader(ctx))
	leader, ok := e.Leader()
	require.True(t, ok)
	require.NoError(t, guardedWrite(ctx, pool, ledger, leader))
	require.NoError(t, e.Close(ctx))
	err := guardedWrite(ctx, pool, ledger, leader)
	require.ErrorIs(t, err, pglease.ErrLost, "a leader that resigned guards nothing")
	assert.Len(t, readLedger(t, pool, ledger), 1)
}

// A guarded transaction holds the lease row, and so this holder's own
// heartbeat of that row, until it ends. Held for less than the trust window
// left (TTL - margin since the last heartbeat, at worst TTL - margin -
// interval), the lease survives; held longer, the lease is lost locally,
// and the commit is still safe: the row stayed locked, so no later mandate
// could begin. The figures (how long the heartbeat was held back) are logged.
func TestGuardHeldLongHoldsBackTheHeartbeatAndPastTheTrustWindowLosesOnlyLocally(t *testing.T) {
	t.Parallel()
	const (
		ttl      = 2 * time.Second
		interval = 400 * time.Millisecond
	)
	for _, hold := range []time.Duration{interval, ttl + interval} {
		t.Run(hold.String(), func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			ledger := newLedger(t, pool)
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
}

// Guarantee: every failure of Guard leaves its transaction aborted, so that
// a caller who ignores the error and commits writes nothing, whatever the
// reason was found: a lease the Locker already knows has ended (lost at a
// heartbeat, released, or its Locker closed) fails without asking the
// server, and must abort the transaction all the same.
func TestGuardThatFailsLeavesTheTransactionAbortedWhateverItFound(t *testing.T) {
	t.Parallel()
	ended := map[string]func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string, l *pglease.Locker, lease *pglease.Lease){
		"LostAtAHeartbeat": func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string, _ *pglease.Locker, lease *pglease.Lease) {
			t.Helper()
			_, err := pglease.ForceExpire(ctx, pool, lease.Key(), pglease.WithTable(table))
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
			ledger := newLedger(t, pool)
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
			assert.Empty(t, readLedger(t, pool, ledger),
				"the guarded write of an ended lease committed (Commit returned %v)", commitErr)
		})
	}
}

// takeOverFrom claims key with l again and again until the server lets it, as
// a replica waiting for a lapsed lease, within limit: the new mandate's
// fence is above the one of prev.
func takeOverFrom(ctx context.Context, t *testing.T, l *pglease.Locker, key string, prev *pglease.Lease, limit time.Duration) *pglease.Lease {
	t.Helper()
	var next *pglease.Lease
	require.Eventually(t, func() bool {
		var err error
		next, err = l.Claim(ctx, key)
		return err == nil
	}, limit, 5*time.Millisecond, "%s never took %q", l.Holder(), key)
	require.Greater(t, next.Fence(), prev.Fence())
	return next
}

// commitOrderedLedgerDDL creates a ledger whose rows are numbered in commit
// order: a deferred constraint trigger gives each row its number from a
// sequence at COMMIT, after every statement of the transaction. A
// transaction that waits on a row lock before its commit thus gets its
// number late, which an id drawn at INSERT would not show. The trigger runs
// before the commit is durable, so two transactions committing at once may
// be numbered in either order; a guarded one still holds the lease row then,
// so no later mandate's claim, hence no later mandate's write, can come
// between.
const commitOrderedLedgerDDL = `CREATE TABLE %[1]s (id bigserial PRIMARY KEY,
	key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL, token text NOT NULL UNIQUE, seq bigint);
CREATE SEQUENCE %[1]s_commit;
CREATE FUNCTION %[1]s_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE %[1]s SET seq = nextval('%[1]s_commit') WHERE id = NEW.id;
	RETURN NULL;
END $$;
CREATE CONSTRAINT TRIGGER number_at_commit AFTER INSERT ON %[1]s
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION %[1]s_number()`

// readLedgerTokens reads every row of a ledger of commitOrderedLedgerDDL in
// commit order, its number at commit (seq) as its id.
func readLedgerTokens(t *testing.T, db pglease.DB, ledger string) []ledgerEntry {
	t.Helper()
	return queryLedger(t, db, fmt.Sprintf(`SELECT seq, key, holder, fence, token FROM %s ORDER BY seq`, ledger))
}
