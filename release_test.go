package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestRelease pins the release statements' commit: a commit that cannot
// get the notification queue's lock within the release's lock wait is
// sent again at once without its notification, so that a busy queue
// neither keeps a release from getting through nor holds the heartbeat
// back, whatever the path (an Unlock alone, a burst of Unlocks, a table
// without a fence column, a pooler).
func TestRelease(t *testing.T) {
	t.Parallel()
	t.Run("QuietResend", testReleaseQuietResend)
	t.Run("SharedReportsUnderConcurrentUnlocks", testReleaseSharedReportsUnderConcurrentUnlocks)
	// Guarantee: each Unlock of a burst released in one statement returns
	// its own lease's outcome, read by the lease's place in the statement:
	// among free keys, two leases of one key, rows locked elsewhere (one
	// revoked by the transaction that locks it), revoked, force-expired
	// and taken rows, in any order; each released row expires on its own
	// fence, a later holder's row is untouched, each lease gets one end
	// event of the right kind. The same on a table without a fence column.
	t.Run("EachOutcomeOfABurstIsItsOwnLeases", testReleaseOutcomesOfABurst)
	t.Run("EachOutcomeOfABurstIsItsOwnLeasesWithoutFenceColumn", testReleaseOutcomesOfABurstWithoutFenceColumn)
	// Guarantee: a release commits without waiting for a synchronous
	// standby (synchronous_commit off: losing it in a failover only keeps
	// the key until its expiry), so Unlock and Close answer during a
	// partition from the standby, on every kind of DB.
	t.Run("DoesNotWaitForAStandby", testReleaseUnreplicated)
	t.Run("QuietResendThroughPgBouncer", testReleaseQuietResendThroughPgBouncer)
	t.Run("CancelledAtItsCommit", testReleaseCancelledAtItsCommit)
	// Guarantee: a Locker on one *pgx.Conn whose release outlasted its
	// timeout (the link stalled, and pgx closed the connection as the
	// context ended) sends nothing more on it, and its later statements
	// say why instead of pgx's bare "conn closed".
	t.Run("CutByItsTimeoutOnAGivenConnectionSaysWhy", func(t *testing.T) {
		t.Parallel()
		ctx, _, table := pgtest.Setup(t)
		p := pgtest.Proxy(t, "")
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		cfg.Host, cfg.Port = p.Host(), p.Port()
		conn, err := pgx.ConnectConfig(ctx, cfg)
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		l := pgtest.Locker(t, conn, table, "a", pglease.WithTimeout(300*time.Millisecond))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		p.SetMode(faultproxy.Stall)
		require.Error(t, lease.Unlock(ctx), "a release whose reply never came")
		p.SetMode(faultproxy.Forward)
		_, err = l.Claim(ctx, "next")
		require.Error(t, err, "a claim on the connection closed as the release's context ended")
		require.Contains(t, err.Error(), "the connection the Locker was given is closed", "the error says why: %v", err)
	})
	t.Run("BurstsOnABusyNotificationQueue", testReleaseBurstsOnABusyNotificationQueue)
	t.Run("OnAHeavyNotificationQueue", testReleaseOnAHeavyNotificationQueue)
	// Guarantee: a cancel request the driver sent for a statement whose
	// context ended (here a release, on a pool that cancels by cancel
	// request) never lands on a later statement of the Locker: its
	// connection is closed, not given back, so a later claim's commit
	// waiting for a synchronous standby is never cut and handed out.
	// On the pool itself, and on a DB that wraps it (a tracing wrapper)
	// and hands the pool over with Acquire and Stat: the Locker then takes
	// its connections from the pool, and can close them.
	t.Run("CancelRequestNeverReachesALaterClaim", func(t *testing.T) {
		t.Run("Pool", releaseCancelRequestNeverReachesALaterClaim(func(p *pgxpool.Pool) pglease.DB { return p }))
		t.Run("WrapperThatHandsOverItsPool", releaseCancelRequestNeverReachesALaterClaim(func(p *pgxpool.Pool) pglease.DB { return wrappedPool{p} }))
	})
}

// wrappedPool is a DB that wraps a pool, as a tracing wrapper does, and
// hands the pool over to the Locker with Acquire and Stat.
type wrappedPool struct{ p *pgxpool.Pool }

func (w wrappedPool) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	return w.p.Exec(ctx, sql, args...)
}

func (w wrappedPool) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	return w.p.Query(ctx, sql, args...)
}

func (w wrappedPool) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return w.p.QueryRow(ctx, sql, args...)
}

func (w wrappedPool) Begin(ctx context.Context) (pgx.Tx, error) { return w.p.Begin(ctx) }

func (w wrappedPool) Acquire(ctx context.Context) (*pgxpool.Conn, error) { return w.p.Acquire(ctx) }

func (w wrappedPool) Stat() *pgxpool.Stat { return w.p.Stat() }

// releaseCancelRequestNeverReachesALaterClaim is the test on the DB that
// wrap makes of the pool.
func releaseCancelRequestNeverReachesALaterClaim(wrap func(*pgxpool.Pool) pglease.DB) func(*testing.T) {
	return func(t *testing.T) {
		t.Parallel()
		ctx, srv, pool, table := pgtest.PrivateSetup(t)
		late := pgtest.NewLateCancel(t, 2500*time.Millisecond) // past pgx's wait for its answer
		cpool, warned := late.Pool(t, pool.Config().ConnString(), 2)
		l := pgtest.Locker(t, wrap(cpool), table, "holder", pglease.WithTTL(time.Minute), pglease.WithTimeout(200*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		pgtest.AbsentStandby(ctx, t, srv.DSN())

		// The release's reply comes 500 ms late, past its 200 ms timeout: pgx
		// sends a cancel request, which lands 2.5 s later.
		late.DelayNextReply(500 * time.Millisecond)
		t.Logf("Unlock, its reply late: %v", lease.Unlock(ctx))

		cctx, cancel := context.WithTimeout(ctx, 6*time.Second)
		defer cancel()
		got, err := l.Claim(cctx, "free")
		require.Error(t, err, "a lease was handed out whose commit's wait a late cancel request cut (%d WARNINGs)", warned.Load())
		require.Nil(t, got)
		require.Eventually(t, func() bool { return late.Landed() > 0 }, 10*time.Second, 50*time.Millisecond,
			"the late cancel request was delivered: the case is the one described")
	}
}

// quietSpy is a pgx tracer that watches one-row releases: before the quiet
// resend (the release without its notification) is sent, before runs.
type quietSpy struct {
	quiet  atomic.Int64
	mu     sync.Mutex
	before func()
}

func isQuietRelease(sql string) bool {
	return strings.Contains(sql, "RETURNING l.key") && !strings.Contains(sql, "pg_notify")
}

func (q *quietSpy) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if isQuietRelease(data.SQL) {
		q.quiet.Add(1)
		q.mu.Lock()
		before := q.before
		q.mu.Unlock()
		if before != nil {
			before()
		}
	}
	return ctx
}

func (q *quietSpy) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (q *quietSpy) set(f func()) {
	q.mu.Lock()
	q.before = f
	q.mu.Unlock()
}

// busyQueue is a durable private server whose notification queue's lock is
// held nearly all the time by notifying commits with a slow flush.
func busyQueue(t *testing.T, notifiers int, flush time.Duration) (string, string, *pgxpool.Pool) {
	t.Helper()
	srv := pgtest.CrashableServer(t)
	table := pgtest.DurableTable(t, srv)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	_, err := pool.Exec(pgtest.Ctx(t), "CREATE TABLE busy (n int)")
	require.NoError(t, err)
	notifyLoad(t, srv.DSN(), notifiers, flush)
	return srv.DSN(), table, pool
}

func testReleaseQuietResend(t *testing.T) {
	t.Parallel()
	dsn, table, pool := busyQueue(t, 3, 100*time.Millisecond)
	ctx := pgtest.Ctx(t)

	// The quiet resend must keep the lease's min hold.
	t.Run("KeepsTheMinHold", func(t *testing.T) {
		spy := &quietSpy{}
		spyPool := pgtest.PoolAt(t, dsn, spy)
		l := pgtest.Locker(t, spyPool, table, "minhold", pglease.WithTTL(30*time.Second), pglease.WithMinHold(3*time.Second))
		pglease.SetCoalesceAll(l, false)
		for i := range 8 {
			key := fmt.Sprintf("minhold-%d", i)
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			require.NoError(t, lease.Unlock(ctx), key)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			hold := row.ExpiresAt.Sub(row.AcquiredAt)
			require.GreaterOrEqual(t, hold, 3*time.Second-time.Millisecond, "%s: released with a hold of %v, min hold 3s", key, hold)
			require.Less(t, hold, 4*time.Second, "%s: not released (hold %v)", key, hold)
		}
		t.Logf("quiet resends: %d of 8", spy.quiet.Load())
		require.Positive(t, spy.quiet.Load(), "the load never made a release's commit fail: the quiet path was not tried")
	})

	// Between the failed notifying commit and the quiet resend, a re-entrant
	// claim of the same holder takes the row with a new fence: the quiet
	// resend must touch nothing and the Unlock must report ErrLost.
	t.Run("MeetsANewerLease", func(t *testing.T) {
		spy := &quietSpy{}
		spyPool := pgtest.PoolAt(t, dsn, spy)
		oldL := pgtest.Locker(t, spyPool, table, "same", pglease.WithTTL(30*time.Second))
		pglease.SetCoalesceAll(oldL, false)
		newL := pgtest.Locker(t, pool, table, "same", pglease.WithTTL(30*time.Second), pglease.StoredHolder(oldL.Holder()))
		hits := 0
		for i := range 8 {
			key := fmt.Sprintf("newer-%d", i)
			old, err := oldL.Claim(ctx, key)
			require.NoError(t, err)
			var fresh *pglease.Lease
			var claimErr error
			spy.set(func() {
				if fresh == nil {
					fresh, claimErr = newL.Claim(ctx, key)
				}
			})
			unlockErr := old.Unlock(ctx)
			spy.set(nil)
			if fresh == nil {
				require.NoError(t, unlockErr, key)
				continue
			}
			hits++
			require.NoError(t, claimErr)
			require.ErrorIs(t, unlockErr, pglease.ErrLost, "%s: the old mandate's quiet release after a newer mandate", key)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.Equal(t, fresh.Fence(), row.Fence)
			require.True(t, row.ExpiresAt.After(time.Now().Add(20*time.Second)), "%s: the newer mandate's row was cut to %v", key, row.ExpiresAt)
			require.NoError(t, fresh.Err())
			require.NoError(t, fresh.Unlock(ctx))
		}
		t.Logf("quiet resends met by a newer mandate: %d of 8", hits)
		require.Positive(t, hits, "the quiet path was never taken")
	})

	// A waiter of the key (ClaimWait) while the holder's release goes out
	// without its notification: ClaimWait says it wakes when the key is
	// released (the release notifies), at the holder's expiry, or at its
	// backoff, 5s at most once notifications arrive. The quiet release
	// notifies nobody: the waiter must still get the key within that 5s.
	t.Run("WakesAWaiter", func(t *testing.T) {
		spy := &quietSpy{}
		spyPool := pgtest.PoolAt(t, dsn, spy)
		a := pgtest.Locker(t, spyPool, table, "holder-a", pglease.WithTTL(30*time.Second))
		pglease.SetCoalesceAll(a, false)
		refused := make(chan string, 64) // the keys of the waiter's refused attempts
		b := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "waiter-b", pglease.WithTTL(30*time.Second),
			pglease.WithHook(func(ev pglease.Event) {
				if ev.Kind == pglease.EventContended {
					select {
					case refused <- ev.Key:
					default:
					}
				}
			}))
		var worst time.Duration
		quiet := 0
		for i := range 4 {
			key := fmt.Sprintf("wait-%d", i)
			lease, err := a.Claim(ctx, key)
			require.NoError(t, err)
			got := make(chan time.Time, 1)
			go func() {
				wl, err := b.ClaimWait(ctx, key)
				if err == nil {
					_ = wl.Unlock(context.Background())
				}
				got <- time.Now()
			}()
			waitRefusal(t, refused, key) // the waiter has tried once and waits
			before := spy.quiet.Load()
			require.NoError(t, lease.Unlock(ctx))
			done := time.Now()
			at := <-got
			took := at.Sub(done)
			wasQuiet := spy.quiet.Load() > before
			if wasQuiet {
				quiet++
				worst = max(worst, took)
			}
			t.Logf("%s: quiet %v, waiter got the key %v after the Unlock", key, wasQuiet, took)
		}
		require.Positive(t, quiet, "the quiet path was never taken")
		require.Less(t, worst, 5500*time.Millisecond, "a waiter woke %v after a quiet release", worst)
	})
}

// waitRefusal waits until refused names key: a waiting claim of key was
// refused once.
func waitRefusal(t *testing.T, refused <-chan string, key string) {
	t.Helper()
	limit := time.After(10 * time.Second)
	for {
		select {
		case k := <-refused:
			if k == key {
				return
			}
		case <-limit:
			t.Fatalf("no attempt of the waiting claim of %s was refused", key)
		}
	}
}

// Releases behind a busy notification queue must not hold the heartbeat
// back for long: on a table without a fence column (every Unlock a burst
// statement), and on a fenced table with the Locker's default coalescing,
// where Unlocks beyond maxAloneInFlight in flight go out as one burst
// Release. 8 workers.
func testReleaseBurstsOnABusyNotificationQueue(t *testing.T) {
	t.Parallel()
	srv := pgtest.CrashableServer(t)
	ctx := pgtest.Ctx(t)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	unfenced := pgtest.TableName()
	_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (%s); CREATE TABLE busy (n int)", unfenced, legacyColumns))
	require.NoError(t, err)
	fencedTable := pgtest.DurableTable(t, srv)
	notifyLoad(t, srv.DSN(), 8, 50*time.Millisecond)
	for _, c := range []struct {
		name    string
		table   string
		opts    []pglease.Option
		alone   bool
		workers int
		claims  bool // claims only, no Unlock: the control of the claims' own cost
	}{
		// Controls: the claims alone, and no more Unlocks in flight than
		// are sent alone (ReleaseOne, whose lock wait bounds each).
		{"FencedClaimsOnly", fencedTable, nil, true, 8, true},
		{"FencedFourUnlocksInFlight", fencedTable, nil, true, 4, false},
		// More in flight than maxAloneInFlight: the rest go out coalesced,
		// as one Release.
		{"FencedEightUnlocksInFlight", fencedTable, nil, true, 8, false},
		{"UnfencedEightUnlocksInFlight", unfenced, []pglease.Option{pglease.WithoutFenceColumn()}, true, 8, false},
		{"UnfencedFourUnlocksInFlight", unfenced, []pglease.Option{pglease.WithoutFenceColumn()}, true, 4, false},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := pgtest.Ctx(t) // each case its own 30s: the cases run in turn
			const interval = 100 * time.Millisecond
			rounds := &roundCounter{}
			opts := append([]pglease.Option{pglease.WithTTL(5 * time.Second),
				pglease.WithHeartbeatInterval(interval), pglease.WithHook(rounds.hook)}, c.opts...)
			l := pgtest.Locker(t, pool, c.table, "gate-"+c.name, opts...)
			if c.alone {
				pglease.SetCoalesceAll(l, false)
			}
			keep, err := l.Claim(ctx, "kept")
			require.NoError(t, err)
			// A release that waited out the NOTIFY lock held the round
			// back for the whole run (a second or more); six intervals
			// leave room for a loaded machine's scheduling. The baseline's
			// second holds ten rounds, its gaps a fraction of that slack.
			heldBackHeartbeat(ctx, t, l, rounds, keep, time.Second, 6*interval, c.workers, "gate", !c.claims)
		})
	}
}

// A release cancelled (57014) while its statement or its commit waits for
// a lock behind the notification queue, the caller still waiting: counted
// skipped and sent again, the Unlock must still end released.
func testReleaseCancelledAtItsCommit(t *testing.T) {
	t.Parallel()
	dsn, table, pool := busyQueue(t, 3, 100*time.Millisecond)
	ctx := pgtest.Ctx(t)
	l := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "cancelled", pglease.WithTTL(30*time.Second))
	pglease.SetCoalesceAll(l, false)

	stop := make(chan struct{})
	var cancels atomic.Int64
	var armed atomic.Bool // one cancel per Unlock: a release cancelled once
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
			}
			if !armed.Load() {
				time.Sleep(time.Millisecond)
				continue
			}
			var n int64
			err := pool.QueryRow(context.Background(), `SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity
				WHERE query LIKE '%pg_notify(%' AND query LIKE '%lock_timeout%' AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()`).Scan(&n)
			if err != nil {
				return
			}
			if n > 0 {
				cancels.Add(n)
				armed.Store(false)
			}
		}
	}()
	defer func() { close(stop); <-done }()
	for i := range 10 {
		key := fmt.Sprintf("cancelled-%d", i)
		lease, err := l.Claim(ctx, key)
		require.NoError(t, err)
		start := time.Now()
		armed.Store(true)
		require.NoError(t, lease.Unlock(ctx), key)
		armed.Store(false)
		row, ok := pgtest.ReadRow(t, pool, table, key)
		require.True(t, ok)
		require.False(t, row.Live, "%s: Unlock said released, the row is live", key)
		t.Logf("%s: released in %v, %d cancels so far", key, time.Since(start), cancels.Load())
	}
	require.Positive(t, cancels.Load(), "no release was cancelled: the case did not happen")
}

// The quiet resend through PgBouncer in transaction pooling, every query
// mode: the failed notifying commit and the resend may land on different
// server connections; the Unlock must end released, the row expired.
func testReleaseQuietResendThroughPgBouncer(t *testing.T) {
	t.Parallel()
	dsn, table, pool := busyQueue(t, 3, 100*time.Millisecond)
	ctx := pgtest.Ctx(t)
	for _, m := range bouncerModes(t) {
		t.Run(m.name, func(t *testing.T) {
			b := pgbouncer.New(t, dsn, m.opts)
			spy := &quietSpy{}
			bounced := pgtest.PoolWith(t, b.DSN(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.DefaultQueryExecMode = m.mode
				cfg.ConnConfig.Tracer = spy
				cfg.MaxConns = 8
			})
			l := pgtest.Locker(t, bounced, table, "bounced-"+m.name, pglease.WithTTL(30*time.Second))
			pglease.SetCoalesceAll(l, false)
			for i := range 5 {
				key := fmt.Sprintf("%s-%d", m.name, i)
				lease, err := l.Claim(ctx, key)
				require.NoError(t, err)
				require.NoError(t, lease.Unlock(ctx), key)
				row, ok := pgtest.ReadRow(t, pool, table, key)
				require.True(t, ok)
				require.False(t, row.Live, key)
			}
			t.Logf("quiet resends: %d of 5", spy.quiet.Load())
			require.Positive(t, spy.quiet.Load(), "the quiet path was never taken")
			// No lock_timeout or synchronous_commit left behind on the
			// pooler's server connections.
			for range 6 {
				var lt, sc string
				require.NoError(t, bounced.QueryRow(ctx, "SELECT current_setting('lock_timeout'), current_setting('synchronous_commit')").Scan(&lt, &sc))
				require.Equal(t, []string{"0", "on"}, []string{lt, sc})
			}
		})
	}
}

// The same as testReleaseBurstsOnABusyNotificationQueue's coalesced
// case behind three times the notifiers at twice the flush: the gap must
// not grow with the queue toward the TTL (2s here) and cost the kept lease.
// ClaimsOnly is the control: the same claims, no Unlock.
func testReleaseOnAHeavyNotificationQueue(t *testing.T) {
	t.Parallel()
	dsn, fencedTable, pool := busyQueue(t, 24, 100*time.Millisecond)
	ctx := pgtest.Ctx(t)
	unfenced := pgtest.TableName()
	_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s (%s)", unfenced, legacyColumns))
	require.NoError(t, err)
	for _, c := range []struct {
		name    string
		table   string
		opts    []pglease.Option
		workers int
		unlock  bool
	}{
		{"ClaimsOnly", fencedTable, nil, 8, false},
		{"FourUnlocksInFlight", fencedTable, nil, 4, true},
		{"EightUnlocksInFlight", fencedTable, nil, 8, true},
		{"UnfencedFourUnlocksInFlight", unfenced, []pglease.Option{pglease.WithoutFenceColumn()}, 4, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			ctx := pgtest.Ctx(t) // each case its own 30s: the cases run in turn
			const interval = 100 * time.Millisecond
			rounds := &roundCounter{}
			opts := append([]pglease.Option{pglease.WithTTL(2 * time.Second),
				pglease.WithHeartbeatInterval(interval), pglease.WithHook(rounds.hook)}, c.opts...)
			l := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), c.table, "heavy-"+c.name, opts...)
			pglease.SetCoalesceAll(l, false)
			keep, err := l.Claim(ctx, "kept-"+c.name)
			require.NoError(t, err)
			// Behind this queue every WAL flush is slow, the heartbeat's own
			// included: the bound is half the TTL, the lease must be kept.
			// The baseline's second holds ten rounds, its gaps a fraction of
			// that slack.
			heldBackHeartbeat(ctx, t, l, rounds, keep, time.Second, time.Second, c.workers, "heavy-"+c.name, c.unlock)
		})
	}
}

// heldBackHeartbeat measures how long job runs hold l's heartbeat back: the
// longest gap between its rounds over window of nothing (the baseline under
// the same load), then while workers goroutines each claim 5 keys
// (prefix-w-i) and, when unlock, Unlock each. It fails unless keep, a lease
// of l, is still held afterwards and the gap stayed within baseline +
// slack, and returns how many Unlocks failed (an Unlock may fail
// truthfully: a lease that lapsed while the server could not flush its
// heartbeat is lost). A shorter window can only make the baseline, and so
// the bound, smaller. A measure during which the test process stalled for
// half the slack or more judges nothing, and is taken again, on new keys,
// three times at most.
func heldBackHeartbeat(ctx context.Context, t *testing.T, l *pglease.Locker, rounds *roundCounter, keep *pglease.Lease,
	window, slack time.Duration, workers int, prefix string, unlock bool) int64 {
	t.Helper()
	for attempt := 1; ; attempt++ {
		watch := pgtest.WatchStalls(t)
		baseline, gap, failed := heartbeatGaps(ctx, t, l, rounds, window, workers, fmt.Sprintf("%s-%d", prefix, attempt), unlock)
		stall := watch.Stop()
		require.NoError(t, keep.Err(), "the kept lease was lost while releases held its heartbeat back")
		if gap < baseline+slack || stall < slack/2 {
			t.Logf("longest stall %v", stall)
			require.Less(t, gap, baseline+slack, "the heartbeat was held back by releases waiting for the NOTIFY lock")
			return failed
		}
		require.Less(t, attempt, 3, "three measures stalled for %v or more (the last %v)", slack/2, stall)
		t.Logf("measure %d stalled %v, half the slack or more: again", attempt, stall)
	}
}

// heartbeatGaps is one measure of heldBackHeartbeat: the baseline gap, the
// gap during the job runs, and how many Unlocks failed.
func heartbeatGaps(ctx context.Context, t *testing.T, l *pglease.Locker, rounds *roundCounter,
	window time.Duration, workers int, prefix string, unlock bool) (baseline, gap time.Duration, failed int64) {
	t.Helper()
	base := time.Now()
	time.Sleep(window)
	baseline = rounds.longestGap(base, time.Now())
	start := time.Now()
	var wg sync.WaitGroup
	var failures atomic.Int64
	for w := range workers {
		wg.Go(func() {
			for i := range 5 {
				lease, err := l.Claim(ctx, fmt.Sprintf("%s-%d-%d", prefix, w, i))
				if err != nil {
					t.Errorf("claim: %v", err)
					return
				}
				if unlock {
					if err := lease.Unlock(ctx); err != nil && failures.Add(1) == 1 {
						t.Logf("first Unlock that failed: %v", err)
					}
				}
			}
		})
	}
	wg.Wait()
	end := time.Now()
	gap = rounds.longestGap(start, end)
	t.Logf("heartbeat gap without releases %v; %v of job runs, %d Unlocks failed; longest gap %v",
		baseline, end.Sub(start), failures.Load(), gap)
	return baseline, gap, failures.Load()
}

func testReleaseUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	dbs := unreplicatedDBs(ctx, t, pool)
	lockers := map[string]*pglease.Locker{}
	unlocked, closed := map[string]*pglease.Lease{}, map[string]*pglease.Lease{}
	for name, on := range dbs {
		l := on.locker(t, table, name)
		var err error
		unlocked[name], err = l.Claim(ctx, name+"-unlocked")
		require.NoError(t, err)
		closed[name], err = l.Claim(ctx, name+"-closed")
		require.NoError(t, err)
		lockers[name] = l
	}
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	for name := range dbs {
		t.Run(name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			require.NoError(t, unlocked[name].Unlock(cctx))
			require.NoError(t, lockers[name].Close(cctx))
			require.NoError(t, cctx.Err(), "a release waited for the standby")
			require.ErrorIs(t, closed[name].Err(), pglease.ErrClosed)
			requireNoLiveRowOf(t, pool, table, name, 0, name+"-unlocked", name+"-closed")
		})
	}
}

// unlockOutcome is what a lease's Unlock must return.
type unlockOutcome struct {
	ok       bool
	revoked  bool
	contains string
}

// burstOfUnlocks is the leases a test unlocks in one burst, each with
// the outcome its Unlock must return.
type burstOfUnlocks []burstUnlock

type burstUnlock struct {
	name string
	ls   *pglease.Lease
	want unlockOutcome
}

func (b *burstOfUnlocks) add(name string, ls *pglease.Lease, want unlockOutcome) {
	*b = append(*b, burstUnlock{name, ls, want})
}

// unlock shuffles b and unlocks its leases in one burst of l's: errs[i]
// is the outcome of b[i].
func (b burstOfUnlocks) unlock(ctx context.Context, l *pglease.Locker) []error {
	rand.Shuffle(len(b), func(i, j int) { b[i], b[j] = b[j], b[i] })
	leases := make([]*pglease.Lease, len(b))
	for i, e := range b {
		leases[i] = e.ls
	}
	return pglease.UnlockBurst(ctx, l, leases)
}

func checkUnlockOutcome(t *testing.T, name string, ls *pglease.Lease, err error, want unlockOutcome) {
	t.Helper()
	if want.ok {
		require.NoError(t, err, "%s (key %s fence %d) must be released", name, ls.Key(), ls.Fence())
		return
	}
	require.Error(t, err, "%s (key %s fence %d) must fail", name, ls.Key(), ls.Fence())
	require.ErrorIs(t, err, pglease.ErrLost, name)
	require.Equal(t, want.revoked, errors.Is(err, pglease.ErrRevoked), "%s: revoked? %v", name, err)
	require.Contains(t, err.Error(), fmt.Sprintf("unlock %q fence %d", ls.Key(), ls.Fence()), name)
	require.Contains(t, err.Error(), want.contains, name)
}

func testReleaseOutcomesOfABurst(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	for round := range 3 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			ev := pgtest.NewEvents(t)
			// No heartbeat in the test's time: every loss is the release's to find.
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("a%d", round), pglease.WithTTL(30*time.Second),
				pglease.WithHeartbeatInterval(10*time.Second), pglease.WithHook(ev.Hook))
			m := pgtest.Locker(t, pool, table, fmt.Sprintf("b%d", round), pglease.WithTTL(30*time.Second),
				pglease.WithHeartbeatInterval(10*time.Second))
			k := func(s string) string { return fmt.Sprintf("r%d-%s", round, s) }
			claim := func(key string) *pglease.Lease {
				ls, err := l.Claim(ctx, key)
				require.NoError(t, err)
				return ls
			}
			var entries burstOfUnlocks
			add := entries.add
			add("free0", claim(k("free0")), unlockOutcome{ok: true})
			add("free1", claim(k("free1")), unlockOutcome{ok: true})
			add("free2", claim(k("free2")), unlockOutcome{ok: true})
			rev := claim(k("rev"))
			taken := claim(k("taken"))
			forced := claim(k("forced"))
			dupOld := claim(k("dup"))
			dupNew := claim(k("dup"))
			require.Greater(t, dupNew.Fence(), dupOld.Fence())
			dup2Old := claim(k("dup2"))
			dup2New := claim(k("dup2"))
			locked := claim(k("locked"))
			lockedRev := claim(k("lockedrev"))

			_, err := admin.Revoke(ctx, rev.Key())
			require.NoError(t, err)
			_, err = admin.ForceExpire(ctx, taken.Key())
			require.NoError(t, err)
			mine, err := m.Claim(ctx, taken.Key())
			require.NoError(t, err)
			_, err = admin.ForceExpire(ctx, forced.Key())
			require.NoError(t, err)

			add("rev", rev, unlockOutcome{revoked: true, contains: "revoke marker"})
			add("taken", taken, unlockOutcome{contains: "taken by a later lease (holder " + m.Holder()})
			add("forced", forced, unlockOutcome{contains: "expired early by an operator"})
			add("dupOld", dupOld, unlockOutcome{contains: "re-claimed"})
			add("dupNew", dupNew, unlockOutcome{ok: true})
			add("dup2Old", dup2Old, unlockOutcome{contains: "re-claimed"})
			add("dup2New", dup2New, unlockOutcome{ok: true})
			add("locked", locked, unlockOutcome{ok: true})
			add("lockedRev", lockedRev, unlockOutcome{revoked: true, contains: "revoke marker"})

			// locked: held by another transaction that lets it go as it
			// was; lockedRev: held by one that revokes it, then commits.
			endLocked := pgtest.LockRow(t, pool, table, locked.Key())
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			t.Cleanup(func() { _ = tx.Rollback(context.Background()) })
			_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = $1 FOR UPDATE`, pgx.Identifier{table}.Sanitize()), lockedRev.Key())
			require.NoError(t, err)
			var wg sync.WaitGroup
			wg.Go(func() {
				time.Sleep(300 * time.Millisecond)
				_, err := tx.Exec(context.Background(), fmt.Sprintf(`UPDATE %s SET holder = $2 WHERE key = $1`, pgx.Identifier{table}.Sanitize()), lockedRev.Key(), sqlstmt.RevokedHolder)
				if err == nil {
					err = tx.Commit(context.Background())
				}
				if err != nil {
					t.Errorf("revoking in the locking transaction: %v", err)
				}
			})
			wg.Go(func() {
				time.Sleep(200 * time.Millisecond)
				endLocked(true)
			})

			errs := entries.unlock(ctx, l)
			wg.Wait()
			for i, e := range entries {
				checkUnlockOutcome(t, e.name, e.ls, errs[i], e.want)
				// Unlock again reports the same outcome.
				again := e.ls.Unlock(ctx)
				require.Equal(t, errs[i] == nil, again == nil, "%s: Unlock again: %v, first %v", e.name, again, errs[i])
			}
			// The later holder's row and lease are untouched.
			require.NoError(t, mine.Err())
			row, ok := pgtest.ReadRow(t, pool, table, taken.Key())
			require.True(t, ok)
			require.Equal(t, mine.Holder(), row.Holder)
			require.Equal(t, mine.Fence(), row.Fence)
			require.True(t, row.Live, "the later holder's row stays live")
			// Each released row expired; on its own fence.
			for _, e := range entries {
				if !e.want.ok {
					continue
				}
				row, ok := pgtest.ReadRow(t, pool, table, e.ls.Key())
				require.True(t, ok)
				require.Equal(t, e.ls.Fence(), row.Fence, e.name)
				require.False(t, row.Live, "%s: released, its row expired", e.name)
			}
			// Events: one end per key and fence, of the right kind.
			for _, e := range entries {
				var kinds []pglease.EventKind
				for _, x := range ev.All() {
					if x.Key == e.ls.Key() && x.Fence == e.ls.Fence() &&
						(x.Kind == pglease.EventReleased || x.Kind == pglease.EventReleaseFailed) {
						kinds = append(kinds, x.Kind)
					}
				}
				if e.want.ok {
					require.Equal(t, []pglease.EventKind{pglease.EventReleased}, kinds, e.name)
				} else {
					require.Equal(t, []pglease.EventKind{pglease.EventReleaseFailed}, kinds, e.name)
				}
			}
			require.NoError(t, mine.Unlock(ctx))
		})
	}
}

// The same burst on a table without a fence column, where the statements
// match each lease by its forged holder: rows revoked, force-expired and
// taken by plain UPDATEs, a row locked elsewhere, two leases of one key.
func testReleaseOutcomesOfABurstWithoutFenceColumn(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	super := pgtest.Pool(t, nil)
	q := pgx.Identifier{table}.Sanitize()
	exec := func(sql string, args ...any) {
		_, err := super.Exec(ctx, sql, args...)
		require.NoError(t, err, sql)
	}
	readRow := func(key string) (holder string, live bool) {
		require.NoError(t, super.QueryRow(ctx, `SELECT holder, expires_at > clock_timestamp() FROM `+q+` WHERE key = $1`, key).Scan(&holder, &live))
		return holder, live
	}
	for round := range 2 {
		t.Run(fmt.Sprintf("round%d", round), func(t *testing.T) {
			opts := []pglease.Option{pglease.WithoutFenceColumn(), pglease.WithTTL(30 * time.Second), pglease.WithHeartbeatInterval(10 * time.Second)}
			l := pgtest.Locker(t, pool, table, fmt.Sprintf("ua%d", round), opts...)
			m := pgtest.Locker(t, pool, table, fmt.Sprintf("ub%d", round), opts...)
			k := func(s string) string { return fmt.Sprintf("u%d-%s", round, s) }
			claim := func(key string) *pglease.Lease {
				ls, err := l.Claim(ctx, key)
				require.NoError(t, err)
				return ls
			}
			var entries burstOfUnlocks
			add := entries.add
			add("free0", claim(k("free0")), unlockOutcome{ok: true})
			add("free1", claim(k("free1")), unlockOutcome{ok: true})
			rev, taken, forced := claim(k("rev")), claim(k("taken")), claim(k("forced"))
			dupOld := claim(k("dup"))
			dupNew := claim(k("dup"))
			locked := claim(k("locked"))
			exec(`UPDATE `+q+` SET holder = $2 WHERE key = $1`, rev.Key(), sqlstmt.RevokedHolder)
			exec(`UPDATE `+q+` SET expires_at = clock_timestamp() WHERE key = $1`, taken.Key())
			theirs, err := m.Claim(ctx, taken.Key())
			require.NoError(t, err)
			exec(`UPDATE `+q+` SET expires_at = clock_timestamp() WHERE key = $1`, forced.Key())
			add("rev", rev, unlockOutcome{revoked: true, contains: "revoke marker"})
			add("taken", taken, unlockOutcome{contains: "taken by a later lease (holder " + theirs.Holder()})
			add("forced", forced, unlockOutcome{contains: "expired early by an operator"})
			add("dupOld", dupOld, unlockOutcome{contains: "re-claimed"})
			add("dupNew", dupNew, unlockOutcome{ok: true})
			add("locked", locked, unlockOutcome{ok: true})
			tx, err := super.Begin(ctx)
			require.NoError(t, err)
			end := pgtest.EndOnce(t, tx)
			_, err = tx.Exec(ctx, `SELECT 1 FROM `+q+` WHERE key = $1 FOR UPDATE`, locked.Key())
			require.NoError(t, err)
			var wg sync.WaitGroup
			wg.Go(func() { time.Sleep(200 * time.Millisecond); end(true) })
			errs := entries.unlock(ctx, l)
			wg.Wait()
			for i, e := range entries {
				checkUnlockOutcome(t, e.name, e.ls, errs[i], e.want)
				if e.want.ok {
					holder, live := readRow(e.ls.Key())
					require.Equal(t, e.ls.Holder(), holder, e.name)
					require.False(t, live, "%s released", e.name)
				}
			}
			holder, live := readRow(taken.Key())
			require.Equal(t, theirs.Holder(), holder)
			require.True(t, live)
			require.NoError(t, theirs.Err())
			require.NoError(t, theirs.Unlock(ctx))
		})
	}
}

// testReleaseSharedReportsUnderConcurrentUnlocks attacks the reports
// ReleaseOne shares between releases (released, skipped, lost): many
// Unlocks at once, each alone or in a burst, of leases released, revoked,
// taken by another holder, expired by an operator, re-claimed, and of rows
// locked for a moment elsewhere (skipped, then released), round after
// round (the second one by one), then Close releasing what is left, one
// lease and then a lost one.
// Guarantee: each Unlock returns its own lease's outcome, and Unlock again
// the same one; a lease released leaves its row expired on its fence; the
// later holder's rows stay live.
func testReleaseSharedReportsUnderConcurrentUnlocks(t *testing.T) {
	t.Parallel()
	for _, burst := range []bool{false, true} {
		t.Run(fmt.Sprintf("burst=%v", burst), func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
			require.NoError(t, err)
			for round := range 3 {
				l := pgtest.Locker(t, pool, table, fmt.Sprintf("a%d", round), pglease.WithTTL(30*time.Second),
					pglease.WithHeartbeatInterval(10*time.Second))
				pglease.SetCoalesceAll(l, burst)
				m := pgtest.Locker(t, pool, table, fmt.Sprintf("b%d", round), pglease.WithTTL(30*time.Second),
					pglease.WithHeartbeatInterval(10*time.Second))
				type entry struct {
					name string
					ls   *pglease.Lease
					want unlockOutcome
				}
				var (
					entries []entry
					theirs  []*pglease.Lease
					locks   []func(bool)
				)
				claim := func(key string) *pglease.Lease {
					ls, err := l.Claim(ctx, key)
					require.NoError(t, err)
					return ls
				}
				for i := range 6 {
					k := func(s string) string { return fmt.Sprintf("r%d-%s%d", round, s, i) }
					entries = append(entries, entry{"free", claim(k("free")), unlockOutcome{ok: true}})
					rev := claim(k("rev"))
					_, err := admin.Revoke(ctx, rev.Key())
					require.NoError(t, err)
					entries = append(entries, entry{"rev", rev, unlockOutcome{revoked: true, contains: "revoke marker"}})
					taken := claim(k("taken"))
					_, err = admin.ForceExpire(ctx, taken.Key())
					require.NoError(t, err)
					mine, err := m.Claim(ctx, taken.Key())
					require.NoError(t, err)
					theirs = append(theirs, mine)
					entries = append(entries, entry{"taken", taken, unlockOutcome{contains: "taken by a later lease (holder " + m.Holder()}})
					forced := claim(k("forced"))
					_, err = admin.ForceExpire(ctx, forced.Key())
					require.NoError(t, err)
					entries = append(entries, entry{"forced", forced, unlockOutcome{contains: "expired early by an operator"}})
					old := claim(k("dup"))
					entries = append(entries, entry{"dupOld", old, unlockOutcome{contains: "re-claimed"}},
						entry{"dupNew", claim(k("dup")), unlockOutcome{ok: true}})
					locked := claim(k("locked"))
					locks = append(locks, pgtest.LockRow(t, pool, table, locked.Key()))
					entries = append(entries, entry{"locked", locked, unlockOutcome{ok: true}})
				}
				rand.Shuffle(len(entries), func(i, j int) { entries[i], entries[j] = entries[j], entries[i] })
				go func() {
					time.Sleep(100 * time.Millisecond)
					for _, end := range locks {
						end(false)
					}
				}()
				errs := make([]error, len(entries))
				var wg sync.WaitGroup
				for i, e := range entries {
					if round == 1 { // one by one: each alone, through ReleaseOne
						errs[i] = e.ls.Unlock(ctx)
						continue
					}
					wg.Go(func() { errs[i] = e.ls.Unlock(ctx) })
				}
				wg.Wait()
				for i, e := range entries {
					checkUnlockOutcome(t, e.name, e.ls, errs[i], e.want)
					again := e.ls.Unlock(ctx)
					require.Equal(t, errs[i] == nil, again == nil, "%s: Unlock again: %v, first %v", e.name, again, errs[i])
					if e.want.ok {
						row, ok := pgtest.ReadRow(t, pool, table, e.ls.Key())
						require.True(t, ok)
						require.Equal(t, e.ls.Fence(), row.Fence, e.name)
						require.False(t, row.Live, "%s: released, its row expired", e.name)
					}
				}
				for _, mine := range theirs {
					require.NoError(t, mine.Err())
					row, ok := pgtest.ReadRow(t, pool, table, mine.Key())
					require.True(t, ok)
					require.Equal(t, []any{mine.Holder(), mine.Fence(), true}, []any{row.Holder, row.Fence, row.Live})
				}
				// Close releases one lease (ReleaseOne): then a lost one.
				last := claim(fmt.Sprintf("r%d-last", round))
				require.NoError(t, l.Close(ctx))
				require.ErrorIs(t, last.Err(), pglease.ErrClosed)
				row, ok := pgtest.ReadRow(t, pool, table, last.Key())
				require.True(t, ok)
				require.False(t, row.Live, "released by Close")

				ev := pgtest.NewEvents(t)
				n := pgtest.Locker(t, pool, table, fmt.Sprintf("c%d", round), pglease.WithTTL(30*time.Second),
					pglease.WithHeartbeatInterval(10*time.Second), pglease.WithHook(ev.Hook))
				pglease.SetCoalesceAll(n, burst)
				lost, err := n.Claim(ctx, fmt.Sprintf("r%d-lostatclose", round))
				require.NoError(t, err)
				_, err = admin.ForceExpire(ctx, lost.Key())
				require.NoError(t, err)
				require.NoError(t, n.Close(ctx), "a lease already lost is no error of Close's")
				var failed []error
				for _, x := range ev.All() {
					if x.Kind == pglease.EventReleaseFailed && x.Key == lost.Key() {
						failed = append(failed, x.Err)
					}
				}
				require.Len(t, failed, 1, "Close's release of the lost lease reports its loss")
				require.ErrorIs(t, failed[0], pglease.ErrLost)
				require.ErrorContains(t, failed[0], "expired early by an operator")
				// A plain release still reports released afterwards.
				o := pgtest.Locker(t, pool, table, fmt.Sprintf("d%d", round))
				pglease.SetCoalesceAll(o, burst)
				x, err := o.Claim(ctx, fmt.Sprintf("r%d-after", round))
				require.NoError(t, err)
				require.NoError(t, x.Unlock(ctx))
			}
		})
	}
}
