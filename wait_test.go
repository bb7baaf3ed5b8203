package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// claimWaitAsync starts l.ClaimWait(ctx, key) and returns its outcome.
func claimWaitAsync(ctx context.Context, l *pglease.Locker, key string) <-chan claimResult {
	out := make(chan claimResult, 1)
	go func() {
		lease, err := l.ClaimWait(ctx, key)
		out <- claimResult{lease, err}
	}()
	return out
}

type claimResult struct {
	lease *pglease.Lease
	err   error
}

func receive(t *testing.T, ch <-chan claimResult, limit time.Duration) claimResult {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(limit):
		t.Fatalf("waiting claim still waiting after %v", limit)
	}
	return claimResult{}
}

// holdAndWait has holder claim "job", then starts waiter's ClaimWait of
// it: the key's lease, and the outcome of the waiting claim.
func holdAndWait(ctx context.Context, t *testing.T, holder, waiter *pglease.Locker) (*pglease.Lease, <-chan claimResult) {
	t.Helper()
	held, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	return held, claimWaitAsync(ctx, waiter, "job")
}

// parkedWait is a lease table where Locker "holder" holds "job" while
// Locker "waiter", its events recorded, has a ClaimWait of it parked,
// listening for the release.
type parkedWait struct {
	ctx            context.Context
	pool           *pgxpool.Pool
	table          string
	events         *pgtest.Events
	holder, waiter *pglease.Locker
	held           *pglease.Lease     // the holder's lease of "job"
	got            <-chan claimResult // the outcome of the waiter's ClaimWait
}

func parkWaiter(t *testing.T) parkedWait {
	t.Helper()
	w := parkedWait{events: pgtest.NewEvents(t)}
	w.ctx, w.pool, w.table = pgtest.Setup(t)
	w.holder = pgtest.Locker(t, w.pool, w.table, "holder")
	w.waiter = pgtest.Locker(t, w.pool, w.table, "waiter", pglease.WithHook(w.events.Hook))
	w.held, w.got = holdAndWait(w.ctx, t, w.holder, w.waiter)
	w.events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	waitingOn(t, w.waiter, w.events, "job", 1)
	return w
}

// release has the holder release "job" and returns the outcome of the
// waiter's claim, which must come within limit.
func (w parkedWait) release(t *testing.T, limit time.Duration) claimResult {
	t.Helper()
	require.NoError(t, w.held.Unlock(w.ctx))
	return receive(t, w.got, limit)
}

// waitingOn waits until l has a claim of key parked after finding it held.
func waitingOn(t *testing.T, l *pglease.Locker, events *pgtest.Events, key string, n int) {
	t.Helper()
	require.Eventually(t, func() bool {
		return pglease.Waiters(l, key) >= n && events.Count(pglease.EventContended) >= 1
	}, 10*time.Second, 2*time.Millisecond, "waiters parked")
}

func TestReleaseNotifiesTheReleasedKeyOnTheTablesChannel(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	_, err = conn.Exec(ctx, "LISTEN "+pgx.Identifier{pglease.ChannelFor(table)}.Sanitize())
	require.NoError(t, err)

	l := pgtest.Locker(t, pool, table, "a")
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))
	wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	n, err := conn.WaitForNotification(wctx)
	require.NoError(t, err, "the release notified nothing")
	require.Equal(t, "job", n.Payload)

	// A release that finds a later mandate's row releases nothing and
	// notifies nothing.
	stale, err := l.Claim(ctx, "job2")
	require.NoError(t, err)
	_, err = l.Claim(ctx, "job2") // re-entrant: stale is lost
	require.NoError(t, err)
	require.ErrorIs(t, stale.Unlock(ctx), pglease.ErrLost)
	wctx, cancel = context.WithTimeout(ctx, 300*time.Millisecond)
	defer cancel()
	n, err = conn.WaitForNotification(wctx)
	require.Error(t, err, "notified %v for a release that released nothing", n)
}

func TestChannelNamesFitPgNotifyAndStayDistinctForOddAndLongTableNames(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	names := []string{
		"lease", `we"ird`, "with space", "ünïcödé_tåble", "public.lease",
		strings.Repeat("a", 63), strings.Repeat("a", 62) + "b", "s." + strings.Repeat("t", 63),
		strings.Repeat("é", 31) + "x", strings.Repeat("ü", 40) + "." + strings.Repeat("ö", 31),
		`"; DROP TABLE x; --`,
	}
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	defer conn.Close(context.Background())
	seen := map[string]string{}
	for _, name := range names {
		ch := pglease.ChannelFor(name)
		require.LessOrEqual(t, len(ch), 63, "channel of %q", name)
		require.Equal(t, ch, pglease.ChannelFor(name), "stable")
		if other, dup := seen[ch]; dup {
			t.Fatalf("tables %q and %q share channel %q", name, other, ch)
		}
		seen[ch] = name
		// LISTEN takes it as an identifier, pg_notify as text: both must
		// name the same channel, which a truncation would break.
		_, err := conn.Exec(ctx, "LISTEN "+pgx.Identifier{ch}.Sanitize())
		require.NoError(t, err, "LISTEN %q", ch)
		_, err = conn.Exec(ctx, "SELECT pg_notify($1, 'k')", ch)
		require.NoError(t, err, "pg_notify %q", ch)
		n, err := conn.WaitForNotification(ctx)
		require.NoError(t, err)
		require.Equal(t, ch, n.Channel)
		_, err = conn.Exec(ctx, "UNLISTEN *")
		require.NoError(t, err)
	}
}

func TestClaimWaitWakesByNotificationWhenTheHolderReleases(t *testing.T) {
	t.Parallel()
	w := parkWaiter(t)
	mode, reason := w.waiter.WaitMode()
	require.Equal(t, pglease.WaitByNotification, mode, reason)

	// With the default TTL, no expiry and a 5s safety backoff: only the
	// notification can wake it within the bound.
	r := w.release(t, 3*time.Second)
	require.NoError(t, r.err)
	row, _ := pgtest.ReadRow(t, w.pool, w.table, "job")
	require.Equal(t, "waiter", row.Holder)
	require.Equal(t, r.lease.Fence(), row.Fence)
}

func TestClaimWaitWakesAtTheHoldersExpiryWhichNotifiesNobody(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	events := pgtest.NewEvents(t)
	waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook))
	// A holder that crashed: its row lapses in 700ms, and nothing notifies.
	_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, expires_at) VALUES ('job', 'crashed', clock_timestamp() + interval '700 milliseconds')`,
		pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)

	got := claimWaitAsync(ctx, waiter, "job")
	events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	// Woken at the expiry read on the server, well before the 5s backoff.
	r := receive(t, got, 4*time.Second)
	require.NoError(t, r.err)
	require.Equal(t, "waiter", r.lease.Holder())
}

func TestClaimWaitFallsBackToPollingThroughPgBouncerTransactionPoolingAndStillAcquires(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
	pool := bouncedPool(t, b, pgx.QueryExecModeExec)
	table := pgtest.Table(t, pool)
	events := pgtest.NewEvents(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook))

	held, got := holdAndWait(ctx, t, holder, waiter)
	ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
	for ev.Err == nil || !strings.Contains(ev.Err.Error(), "probe") {
		ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
	}
	mode, reason := waiter.WaitMode()
	require.Equal(t, pglease.WaitByPolling, mode)
	require.Contains(t, reason, "did not arrive")
	require.NoError(t, held.Unlock(ctx))
	r := receive(t, got, 5*time.Second)
	require.NoError(t, r.err)
	require.Equal(t, "waiter", r.lease.Holder())
}

func TestClaimWaitPollsOnADBThatIsNotAPoolAndSaysWhy(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	waiter := pgtest.Locker(t, pgtest.NewFaultyDB(pool), table, "waiter")
	held, got := holdAndWait(ctx, t, holder, waiter)
	require.Eventually(t, func() bool { m, _ := waiter.WaitMode(); return m == pglease.WaitByPolling }, 5*time.Second, 2*time.Millisecond, "polling")
	_, reason := waiter.WaitMode()
	require.Contains(t, reason, "not a *pgxpool.Pool")
	require.NoError(t, held.Unlock(ctx))
	require.NoError(t, receive(t, got, 5*time.Second).err)
}

func TestClaimWaitThatGivesUpNeverLeavesALeaseBehind(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	waiter := pgtest.Locker(t, pool, table, "waiter")

	// Given up while held: ErrHeld and the context's error, nothing claimed.
	_, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = waiter.ClaimWait(wctx, "job")
	cancel()
	require.ErrorIs(t, err, pglease.ErrHeld)
	require.ErrorIs(t, err, context.DeadlineExceeded)

	// Deadlines that end around the release: whatever the outcome, the
	// waiter holds the key if and only if it returned a lease.
	for i := range 30 {
		key := fmt.Sprintf("race-%d", i)
		held, err := holder.Claim(ctx, key)
		require.NoError(t, err)
		wctx, cancel := context.WithTimeout(ctx, time.Duration(20+i)*time.Millisecond)
		got := claimWaitAsync(wctx, waiter, key)
		time.Sleep(20 * time.Millisecond) // spreads the release around the deadline
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 5*time.Second)
		cancel()
		row, ok := pgtest.ReadRow(t, pool, table, key)
		require.True(t, ok)
		if r.err == nil {
			require.Equal(t, "waiter", row.Holder)
			require.True(t, row.Live)
			require.NoError(t, r.lease.Unlock(ctx))
			continue
		}
		require.ErrorIs(t, r.err, context.DeadlineExceeded)
		_, ok = waiter.Held(key)
		require.False(t, ok, "the waiter gave up but holds %q", key)
		require.False(t, row.Live && row.Holder == "waiter", "the waiter gave up (%v) but its row is live: %+v", r.err, row)
	}
}

func TestWaitersOfOneLockerSendOneClaimPerReleaseAndOneWinsEachTime(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	counter := &pgtest.Statements{}
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	events := pgtest.NewEvents(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	waiter := pgtest.Locker(t, pgtest.Pool(t, counter), table, "waiter", pglease.WithHook(events.Hook))

	held, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	const n = 8
	results := make(chan claimResult, n)
	for range n {
		go func() {
			lease, err := waiter.ClaimWait(ctx, "job")
			results <- claimResult{lease, err}
		}()
	}
	events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	events.WaitFor(t, pglease.EventContended, 10*time.Second) // the retry after LISTEN
	waitingOn(t, waiter, events, "job", n)
	counter.Reset()
	require.NoError(t, held.Unlock(ctx))

	// Each winner holds the key alone; its Unlock hands it to the next.
	for i := range n {
		r := receive(t, results, 10*time.Second)
		require.NoError(t, r.err)
		_, ok := waiter.Held("job")
		require.True(t, ok)
		select {
		case other := <-results:
			t.Fatalf("two waiters hold the key at once: fences %d and %d", r.lease.Fence(), other.lease.Fence())
		case <-time.After(20 * time.Millisecond):
		}
		// One claim per release; a herd would be one per waiter (n). A
		// waiter whose safety pause (2.5s to 5s) ends on its own on a
		// loaded machine may add one: two are allowed for the whole run.
		claims := counter.Count("claim")
		assert.LessOrEqual(t, claims, i+1+2, "claim statements for %d releases", i+1)
		require.NoError(t, r.lease.Unlock(ctx))
	}
	t.Logf("claim statements for %d waiters: %d", n, counter.Count("claim"))
}

func TestWaitersOfSeveralLockersTakeTheKeyOneAtATime(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const lockers, each = 3, 3
	var holding atomic.Int32
	var wg sync.WaitGroup
	errs := make(chan error, lockers*each)
	wins := atomic.Int32{}
	for i := range lockers {
		l := pgtest.Locker(t, pool, table, fmt.Sprintf("l%d", i))
		for range each {
			wg.Go(func() {
				lease, err := l.ClaimWait(ctx, "job")
				if err != nil {
					errs <- err
					return
				}
				if holding.Add(1) != 1 {
					errs <- errors.New("two holders at once")
				}
				wins.Add(1)
				time.Sleep(5 * time.Millisecond) // the work done under the lease
				holding.Add(-1)
				if err := lease.Unlock(ctx); err != nil {
					errs <- err
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	require.EqualValues(t, lockers*each, wins.Load())
}

func TestClaimWaitWakesAfterTheListenerIsKilledMidWait(t *testing.T) {
	t.Parallel()
	w := parkWaiter(t)
	pid := pglease.ListenerPID(w.waiter)
	require.NotZero(t, pid)
	_, err := w.pool.Exec(w.ctx, "SELECT pg_terminate_backend($1)", pid)
	require.NoError(t, err)
	w.events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
	// Released while nobody listens, or right after the new LISTEN: either
	// way the waiter takes the key within the bound.
	r := w.release(t, 4*time.Second)
	require.NoError(t, r.err)
	w.events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	require.NotEqual(t, pid, pglease.ListenerPID(w.waiter), "listening again on a new connection")

	// And it still wakes by notification.
	got := claimWaitAsync(w.ctx, w.holder, "job")
	require.NoError(t, r.lease.Unlock(w.ctx))
	require.NoError(t, receive(t, got, 4*time.Second).err)
}

func TestCloseEndsWaitingClaimsPromptlyWithErrClosed(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	events := pgtest.NewEvents(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	waiter := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("waiter"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook))
	_, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	var outs []<-chan claimResult
	for range 3 {
		outs = append(outs, claimWaitAsync(ctx, waiter, "job"))
	}
	events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
	waitingOn(t, waiter, events, "job", 3)
	require.NoError(t, waiter.Close(ctx))
	for _, out := range outs {
		r := receive(t, out, 2*time.Second)
		require.ErrorIs(t, r.err, pglease.ErrClosed)
	}
	_, err = waiter.ClaimWait(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrClosed)
}

func TestClaimWaitDoesNotTakeOverALeaseOfItsOwnLocker(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "one")
	first, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err = l.ClaimWait(wctx, "job")
	cancel()
	require.ErrorIs(t, err, pglease.ErrHeld)
	require.NoError(t, first.Err(), "a waiting claim took over the Locker's own lease")

	got := claimWaitAsync(ctx, l, "job")
	require.NoError(t, first.Unlock(ctx))
	r := receive(t, got, 2*time.Second)
	require.NoError(t, r.err)
	require.Greater(t, r.lease.Fence(), first.Fence())
}

// Guarantee: the give-back of a waiting claim whose outcome it never learned
// acts on exactly the mandate that claim made, however late it reaches the
// server: here the claim's reply is lost after its commit, the give-back
// is held up on the network until the Locker has claimed the key again, and
// it arrives then. It must leave the newer lease's row alone: expired, the
// key would go to another replica while this Locker still holds it.
func TestLateGiveBackOfAFailedClaimWaitLeavesTheLockersNewerLeaseUntouched(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	wire := pgtest.NewWire(t, pool)
	a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(10*time.Second), pglease.WithTimeout(2*time.Second))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(10*time.Second))
	pglease.SetCoalescing(a, false)

	claim := wire.Arm(pgtest.Kind("claim"), pgtest.LoseReply)
	// Whatever gives the row back (a write that is not a claim) is held up.
	giveBack := wire.Arm(func(sql string) bool {
		return pgtest.StatementKind(sql) != "claim" && strings.Contains(sql, "UPDATE")
	}, pgtest.DeliverLate)
	_, err := a.ClaimWait(ctx, "job")
	require.Error(t, err, "the claim's reply was lost")
	<-claim.Ran

	newer, err := a.Claim(ctx, "job")
	require.NoError(t, err, "a claims the key again")
	select {
	case <-giveBack.Hit:
		giveBack.Deliver()
		<-giveBack.Ran
	default:
		t.Log("no give-back was sent: the orphaned row lapses at its expiry")
	}

	_, err = b.Claim(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld, "b took the key while a holds fence %d", newer.Fence())
	_, held := a.Held("job")
	require.True(t, held)
	row, _ := pgtest.ReadRow(t, pool, table, "job")
	require.Equal(t, newer.Fence(), row.Fence)
	require.True(t, row.Live)
}

// Guarantee: a waiting claim that fails gives back what its claim may have
// committed on the terms that claim was made on, the Locker's own: not the
// longest min hold of any job of the Locker, which would keep the key from
// every replica for that long.
func TestGiveBackOfAFailedClaimWaitKeepsOnlyTheMinHoldOfItsOwnTerms(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	wire := pgtest.NewWire(t, pool)
	a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second))
	_, err := a.Job(pglease.WithTTL(30*time.Second), pglease.WithMinHold(20*time.Second))
	require.NoError(t, err)
	b := pgtest.Locker(t, pool, table, "b")
	pglease.SetCoalescing(a, false)

	claim := wire.Arm(pgtest.Kind("claim"), pgtest.LoseReply)
	_, err = a.ClaimWait(ctx, "job")
	require.Error(t, err)
	<-claim.Ran

	lease, err := b.Claim(ctx, "job")
	require.NoError(t, err, "the given-back key stays held by nobody")
	require.NoError(t, lease.Unlock(ctx))
}
