package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// lostReplyDB runs every statement for real, but once armed, the next
// claim statement's reply is lost after the server has run (and committed)
// it: what a connection reset between the commit and the reply does.
type lostReplyDB struct {
	pglease.DB
	armed atomic.Bool
	lost  chan struct{}
}

type lostReplyRow struct {
	pgx.Row
	db *lostReplyDB
}

func (r lostReplyRow) Scan(dest ...any) error {
	if err := r.Row.Scan(dest...); err != nil {
		if errors.Is(err, pgx.ErrNoRows) {
			r.db.armed.Store(true) // a claim that lost wrote nothing: the next one's reply is lost
		}
		return err
	}
	close(r.db.lost)
	return errors.New("read tcp: connection reset by peer (the reply of a committed claim was lost)")
}

func (d *lostReplyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := d.DB.QueryRow(ctx, sql, args...)
	if pgtest.StatementKind(sql) == "claim" && d.armed.CompareAndSwap(true, false) {
		return lostReplyRow{row, d}
	}
	return row
}

// Guarantee: a waiter never leaves a live row for a key it did not return a
// lease for, whatever ended its claim: here the server committed it and the
// connection reset before the reply. Left live, the row would lock every
// other Locker's waiter out until its TTL, with nobody holding the key.
func TestClaimWaitWhoseCommittedClaimLostItsReplyLeavesNoLiveRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	events := pgtest.NewEvents(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	db := &lostReplyDB{DB: pool, lost: make(chan struct{})}
	waiter := pgtest.Locker(t, db, table, "waiter", pglease.WithHook(events.Hook))
	// Each claim its own statement, sent by QueryRow, where the reply is
	// lost (a claim in a burst goes by Query).
	pglease.SetCoalescing(waiter, false)

	held, got := holdAndWait(ctx, t, holder, waiter)
	waitingOn(t, waiter, events, "job", 1)
	db.armed.Store(true)
	require.NoError(t, held.Unlock(ctx))
	r := receive(t, got, 5*time.Second)
	select {
	case <-db.lost:
	case <-time.After(5 * time.Second):
		t.Fatalf("the waiter's claim after the release was not the one whose reply was lost: ClaimWait returned %v", r.err)
	}
	require.Error(t, r.err, "the reply was lost: ClaimWait cannot have a lease")
	t.Logf("ClaimWait returned: %v", r.err)

	_, ok := waiter.Held("job")
	require.False(t, ok)
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)
	require.False(t, row.Live && row.Holder == "waiter",
		"ClaimWait returned an error but left a live row under its holder, held by nobody until %v: %+v", row.ExpiresAt, row)
}

// The same guarantee, without any fault: a claim that waited on a row lock (an
// operator's transaction) for longer than the trust window but less than
// the TTL commits a live row, and Claim answers ErrLost ("took longer than
// the trust window"). ClaimWait must then either give the row back and
// return an error, or claim again and return the lease it holds: never
// leave a live row under its holder that nobody holds.
func TestClaimWaitThatOutwaitsItsTrustWindowOnARowLockLeavesNoLiveRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const ttl = 4 * time.Second // trust window 3.6s
	waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithTTL(ttl), pglease.WithTimeout(10*time.Second))
	tbl := pgx.Identifier{table}.Sanitize()

	// An expired row of a former holder, locked by an open transaction.
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		VALUES ('job', 'old', clock_timestamp() - interval '2 s', clock_timestamp() - interval '1 s')`, tbl))
	require.NoError(t, err)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'job' FOR UPDATE`, tbl))
	require.NoError(t, err)

	got := claimWaitAsync(ctx, waiter, "job")
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'`+" AND query LIKE '%"+table+"%'").Scan(&n))
		return n == 1
	}, 5*time.Second, 10*time.Millisecond, "the waiter's claim waits on the row lock")
	// The scenario: the lock is held 3.8s, past the trust window (3.6s)
	// and within the TTL.
	time.Sleep(ttl - ttl/20)
	require.NoError(t, tx.Commit(ctx))
	r := receive(t, got, 10*time.Second)
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)
	if r.err == nil {
		// Back within the trust window, or given back and claimed again:
		// the live row is the lease ClaimWait returned.
		require.Equal(t, r.lease.Fence(), row.Fence, "the row is the lease ClaimWait returned")
		require.True(t, row.Live)
		require.NoError(t, r.lease.Unlock(ctx))
		return
	}
	t.Logf("ClaimWait returned: %v", r.err)
	require.False(t, row.Live && row.Holder == "waiter",
		"ClaimWait returned an error but left a live row under its holder, held by nobody: %+v", row)
}

// Guarantee: the pool closed before the Locker, with a claim waiting and
// the listener on a hijacked connection: neither Close hangs, the waiter
// ends, and goleak (TestMain) finds nothing left.
func TestPoolClosedBeforeTheLockerWithAWaiterDoesNotHang(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	events := pgtest.NewEvents(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	wpool := pgtest.Pool(t, nil)
	waiter := pglease.NewLocker(wpool, pglease.WithTable(table), pglease.WithHolder("waiter"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook))
	_, got := holdAndWait(ctx, t, holder, waiter)
	events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	waitingOn(t, waiter, events, "job", 1)

	poolClosed := make(chan struct{})
	go func() { wpool.Close(); close(poolClosed) }()
	select {
	case <-poolClosed:
	case <-time.After(5 * time.Second):
		t.Fatal("pool.Close hangs with a Locker's waiter and listener on it")
	}
	closed := make(chan error, 1)
	go func() { closed <- waiter.Close(ctx) }()
	select {
	case err := <-closed:
		t.Logf("Close after the pool closed: %v", err) // its releases could not be sent
	case <-time.After(5 * time.Second):
		t.Fatal("Locker.Close hangs after its pool was closed")
	}
	r := receive(t, got, 5*time.Second)
	require.Error(t, r.err)
	t.Logf("waiter ended with: %v", r.err)
}

// Guarantee: with nobody waiting, Claim and Unlock send one statement
// each, as before waiting claims existed.
func TestNoExtraStatementOnClaimAndUnlockWhenNobodyWaits(t *testing.T) {
	t.Parallel()
	ctx, pool, table, counter := pgtest.SetupCounted(t)
	l := pgtest.Locker(t, pool, table, "one")
	counter.Reset()
	const n = 20
	for i := range n {
		lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
	}
	require.Equal(t, n, counter.Count("claim"))
	require.Equal(t, n, counter.Count("release"))
	require.Zero(t, counter.Count("other"), "statements other than claim and release")
	mode, _ := l.WaitMode()
	require.Equal(t, pglease.WaitIdle, mode, "a listener started without a waiter")
}
