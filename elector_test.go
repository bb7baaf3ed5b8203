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

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

type electedReplica struct {
	name    string
	db      *pgtest.FaultyDB
	elector *pglease.Elector
	sched   gocron.Scheduler
}

// newElector is an Elector for key on a Locker of its own on db, made with
// opts; the Locker, and so the Elector, is closed at cleanup.
func newElector(tb testing.TB, db pglease.DB, key string, opts []pglease.Option, eopts ...pglease.Option) *pglease.Elector {
	tb.Helper()
	l := pgtest.Each(pglease.NewLocker(db, opts...))
	tb.Cleanup(func() { _ = l.Close(context.Background()) })
	e, err := pglease.NewElector(l, key, eopts...)
	require.NoError(tb, err)
	return pgtest.Each(e)
}

// callLog records an Elector's callbacks in the order they ran.
type callLog struct {
	mu    sync.Mutex
	calls []string
	ch    chan string
}

func newCallLog() *callLog { return &callLog{ch: make(chan string, 100)} }

func (c *callLog) add(s string) {
	c.mu.Lock()
	c.calls = append(c.calls, s)
	c.mu.Unlock()
	c.ch <- s
}

func (c *callLog) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.calls...)
}

func (c *callLog) waitFor(t *testing.T, want string, limit time.Duration) {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case got := <-c.ch:
			if got == want {
				return
			}
		case <-deadline:
			t.Fatalf("no callback %q within %v; got %v", want, limit, c.all())
		}
	}
}

// recordingElector is an Elector whose callbacks go to log; its
// OnStartedLeading calls the Elector back, which must not deadlock.
func recordingElector(t *testing.T, db pglease.DB, table, holder string, log *callLog, opts ...pglease.Option) *pglease.Elector {
	t.Helper()
	var e *pglease.Elector
	cb := pglease.LeaderCallbacks{
		OnStartedLeading: func(lease *pglease.Lease) {
			_, leads := e.Leader()
			log.add(fmt.Sprintf("started %d leads=%v", lease.Fence(), leads))
		},
		OnStoppedLeading: func(lease *pglease.Lease) { log.add(fmt.Sprintf("stopped %d", lease.Fence())) },
		OnNewLeader: func(h string) {
			name, _, _ := strings.Cut(h, "#") // the leader's WithHolder
			log.add("leader " + name)
		},
	}
	all := append([]pglease.Option{pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(pgtest.Quiet)}, opts...)
	e = newElector(t, db, pglease.DefaultLeaderKey, all, pglease.WithLeaderCallbacks(cb))
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

// began fails t unless the callback that closes ch starts within 10s.
func began(t *testing.T, ch <-chan struct{}, callback string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not start within 10s", callback)
	}
}

// notReturned fails t if the call that sends on ch returns within 200ms:
// it must wait for a callback that has not returned. (On a loaded machine
// a wrong early return may come later than that and go unseen; a right
// wait never fails here.)
func notReturned(t *testing.T, ch <-chan error, call string) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("%s returned (%v)", call, err)
	case <-time.After(200 * time.Millisecond):
	}
}

// TestElector: one leader at a time, handed over at Close and after a
// crash; callbacks in order; an Elector made from a Locker shares its
// heartbeat and ends with it.
func TestElector(t *testing.T) {
	t.Parallel()
	t.Run("OneLeaderAcrossCrashAndResign", func(t *testing.T) {
		t.Parallel()
		ctx, _, table := pgtest.Setup(t)
		const period, ttl = 200 * time.Millisecond, 1500 * time.Millisecond
		log := newRunLog()
		events := pgtest.NewEvents(t)
		var replicas []*electedReplica
		for i := range 3 {
			name := fmt.Sprintf("replica-%d", i+1)
			db := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
			e := newElector(t, db, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder(name), pglease.WithLogger(pgtest.Quiet),
				pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(300 * time.Millisecond), pglease.WithHook(events.Hook)})
			s, err := gocron.NewScheduler(gocron.WithDistributedElector(e))
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Shutdown() })
			r := &electedReplica{name: name, db: db, elector: e, sched: s}
			_, err = s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {
				lease, ok := e.Leader()
				if !ok {
					t.Errorf("%s runs a job without leading", name)
					return
				}
				x := run{replica: name, fence: lease.Fence(), start: time.Now()}
				time.Sleep(5 * time.Millisecond) // the job's work
				if lease.Err() != nil {
					return // lost during the run: it did not believe itself valid to the end
				}
				x.end = time.Now()
				log.add(x)
				log.started <- x
			}), gocron.WithName("only-on-the-leader"))
			require.NoError(t, err)
			replicas = append(replicas, r)
		}
		for _, r := range replicas {
			r.sched.Start()
		}

		// leaderOf returns the first run after a moment by a replica other
		// than the one that crashed then. The crashed replica's lease stays
		// current in the table until its TTL, so its scheduler, which the test
		// stops only after cutting its database, may still start a run: it
		// must start within that TTL.
		leaderOf := func(after time.Time, crashed string, limit time.Duration) run {
			t.Helper()
			deadline := time.After(limit)
			for {
				select {
				case x := <-log.started:
					if x.replica == crashed {
						require.Less(t, x.start.Sub(after), ttl, "%s ran past its lease's TTL after it crashed", crashed)
						continue
					}
					if x.start.After(after) {
						return x
					}
				case <-deadline:
					t.Fatalf("nobody led within %v", limit)
				}
			}
		}
		byName := func(name string) *electedReplica {
			for _, r := range replicas {
				if r.name == name {
					return r
				}
			}
			t.Fatalf("no replica %s", name)
			return nil
		}

		first := leaderOf(time.Time{}, "", 5*time.Second)

		// Crash the leader: its database access stops dead, nothing is released.
		crashed := time.Now()
		dead := byName(first.replica)
		dead.db.Cut(errors.New("replica crashed"))
		go func() { _ = dead.sched.Shutdown() }()
		second := leaderOf(crashed, first.replica, ttl+5*period)
		require.Greater(t, second.fence, first.fence)
		t.Logf("after a crash, %s led %v later (TTL %v)", second.replica, second.start.Sub(crashed), ttl)
		assert.Less(t, second.start.Sub(crashed), ttl+2*period, "a follower leads within one TTL")

		// The new leader resigns: a follower takes over without waiting for
		// the TTL. Its scheduler is stopped first, so no run of its own can
		// start after the resignation.
		next := byName(second.replica)
		require.NoError(t, next.sched.Shutdown())
		resigned := time.Now()
		require.NoError(t, next.elector.Close(ctx))
		third := leaderOf(resigned, "", ttl)
		require.NotEqual(t, second.replica, third.replica)
		require.Greater(t, third.fence, second.fence)
		t.Logf("after a resignation, %s led %v later", third.replica, third.start.Sub(resigned))
		assert.Less(t, third.start.Sub(resigned), ttl/2, "Close hands over without waiting for the TTL")

		// Never two leaders at once: runs of different replicas never overlap,
		// and the fence never goes back.
		runs := log.all()
		for i := 1; i < len(runs); i++ {
			a, b := runs[i-1], runs[i]
			require.GreaterOrEqual(t, b.fence, a.fence, "fences in time order")
			if a.replica != b.replica {
				require.False(t, b.start.Before(a.end), "%s and %s led at once", a.replica, b.replica)
			}
		}
		require.Positive(t, events.Count(pglease.EventElected))
	})

	t.Run("AnswersFromItsTrustWindow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		var mu sync.Mutex
		var elected []pglease.Event
		key := "leader-of-" + table
		e := newElector(t, pool, key, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
			pglease.WithHook(func(ev pglease.Event) {
				if ev.Kind == pglease.EventElected {
					mu.Lock()
					elected = append(elected, ev)
					mu.Unlock()
				}
			})})
		follower := newElector(t, pool, key, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("b"), pglease.WithLogger(pgtest.Quiet)})

		require.NoError(t, e.IsLeader(ctx))
		counter.Reset()
		for range 100 {
			require.NoError(t, e.IsLeader(ctx))
		}
		assert.Zero(t, counter.Count("claim"), "a fresh leader asks nobody")
		err := follower.IsLeader(ctx)
		require.ErrorIs(t, err, pglease.ErrHeld)
		lease, ok := e.Leader()
		require.True(t, ok)
		mu.Lock()
		require.Len(t, elected, 1)
		assert.Equal(t, lease.Fence(), elected[0].Fence, "the election is reported with the new fence")
		assert.Equal(t, key, elected[0].Key)
		mu.Unlock()

		require.NoError(t, e.Close(ctx))
		require.NoError(t, follower.IsLeader(ctx), "resigned: the follower leads at once")
	})

	// An Elector has no min hold, whatever its Locker's: Close hands
	// leadership over at once. (NewElector refuses WithMinHold.)
	t.Run("NoMinHoldSoCloseHandsOverAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const key = "leader"
		leader := newElector(t, pool, key, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
			pglease.WithTTL(time.Minute), pglease.WithMinHold(30 * time.Second)})
		follower := newElector(t, pool, key, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("b"), pglease.WithLogger(pgtest.Quiet),
			pglease.WithTTL(time.Minute)})

		require.NoError(t, leader.IsLeader(ctx))
		require.NoError(t, leader.Close(ctx))
		row, ok := pgtest.ReadRow(t, pool, table, key)
		require.True(t, ok)
		assert.False(t, row.Live, "resigned leadership expires at once (expires_at %v, acquired_at %v)", row.ExpiresAt, row.AcquiredAt)
		require.NoError(t, follower.IsLeader(ctx), "the follower leads at once")
	})

	// A refused argument changes nothing: Close(nil) panics, naming the
	// missing Context, before it closes anything, so that the Elector still
	// leads, its campaign and callbacks still run, and a later Close
	// resigns and returns with every goroutine gone. IsLeader and Campaign
	// refuse a nil Context the same way.
	t.Run("RefusesANilContext", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		stopped := make(chan struct{})
		e := newElector(t, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet)},
			pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{OnStoppedLeading: func(*pglease.Lease) { close(stopped) }}))
		t.Cleanup(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = e.Close(ctx) // bounded: a Close that waits forever fails the test, not the run
		})
		lease, err := e.Campaign(ctx)
		require.NoError(t, err)

		var nilCtx context.Context
		for name, call := range map[string]func(){
			"Close":    func() { _ = e.Close(nilCtx) },
			"IsLeader": func() { _ = e.IsLeader(nilCtx) },
			"Campaign": func() { _, _ = e.Campaign(nilCtx) },
		} {
			assert.Contains(t, panicMessage(call), "nil Context", name)
			require.NoError(t, lease.Err(), "after %s(nil) the lease is held", name)
			leader, ok := e.Leader()
			require.True(t, ok, "after %s(nil) the Elector still leads", name)
			require.Same(t, lease, leader)
			require.NoError(t, e.IsLeader(ctx), "after %s(nil) the Elector is not closed", name)
		}

		closeCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		require.NoError(t, e.Close(closeCtx), "a Close after the refused one resigns")
		select {
		case <-stopped:
		default:
			t.Fatal("Close returned before OnStoppedLeading ran")
		}
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, e.IsLeader(ctx), pglease.ErrClosed)
	})

	// A revoked leader key has no leader: its holder is the revoke marker
	// ("pglease:revoked"), which no replica has. Neither the revoked leader nor
	// a follower reports the marker as a new leader, by callback or event;
	// the next leader they report is the replica that claims the key once
	// the revoked lease has expired.
	t.Run("NeverReportsTheRevokeMarkerAsALeader", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const key = "the-leader"
		events := pgtest.NewEvents(t)
		var mu sync.Mutex
		reported := map[string][]string{}
		elected := make(chan string, 2)
		elector := func(name string) *pglease.Elector {
			return newElector(t, pool, key, []pglease.Option{pglease.WithTable(table), pglease.WithHolder(name),
				pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook),
				pglease.WithTTL(3 * time.Second), pglease.WithHeartbeatInterval(100 * time.Millisecond)},
				pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
					OnNewLeader: func(holder string) {
						mu.Lock()
						defer mu.Unlock()
						leader, _, _ := strings.Cut(holder, "#") // the leader's WithHolder
						reported[name] = append(reported[name], leader)
					},
					OnStartedLeading: func(*pglease.Lease) { elected <- name },
				}))
		}
		a, b := elector("replica-a"), elector("replica-b")
		lease, err := a.Campaign(ctx)
		require.NoError(t, err)
		require.Equal(t, "replica-a", <-elected)
		require.ErrorIs(t, b.IsLeader(ctx), pglease.ErrHeld)

		rev, err := adminOf(t, pool, pglease.WithTable(table)).Revoke(ctx, key)
		require.NoError(t, err)
		require.True(t, rev.Changed)
		pgtest.WaitDone(t, lease, 5*time.Second)
		// Each sees the revoked row at least once, before it expires.
		require.ErrorIs(t, a.IsLeader(ctx), pglease.ErrHeld)
		require.ErrorIs(t, b.IsLeader(ctx), pglease.ErrHeld)
		require.NoError(t, a.Close(ctx))

		select {
		case name := <-elected:
			require.Equal(t, "replica-b", name)
		case <-time.After(10 * time.Second):
			t.Fatal("no replica led within 10s of the revoke")
		}
		require.NoError(t, b.Close(ctx)) // the callbacks due have run

		mu.Lock()
		defer mu.Unlock()
		assert.Equal(t, []string{"replica-a"}, reported["replica-a"], "the revoked leader")
		assert.Equal(t, []string{"replica-a", "replica-b"}, reported["replica-b"], "the follower")
		for _, ev := range events.All() {
			if ev.Kind == pglease.EventNewLeader {
				assert.NotEqual(t, sqlstmt.RevokedHolder, ev.Holder, "event %+v", ev)
			}
		}
	})

	t.Run("FollowerTakesOverAtTheLeadersClose", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		log1, log2 := newCallLog(), newCallLog()
		e1 := recordingElector(t, pool, table, "e1", log1)
		e2 := recordingElector(t, pool, table, "e2", log2, pglease.WithHook(events.Hook))

		require.NoError(t, e1.IsLeader(ctx))
		require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrHeld) // starts e2's campaign
		log2.waitFor(t, "leader e1", 5*time.Second)
		events.WaitFor(t, pglease.EventWaitByNotification, 10*time.Second)
		first, ok := e1.Leader()
		require.True(t, ok)

		require.NoError(t, e1.Close(ctx))
		// The default TTL is 60s and the safety pause of a notified waiter at
		// least 2.5s: within 2s, only the release's notification wakes e2.
		second := events.WaitFor(t, pglease.EventElected, 2*time.Second)
		require.True(t, strings.HasPrefix(second.Holder, "e2#"), "elected: %q", second.Holder)
		require.Greater(t, second.Fence, first.Fence())
		// EventElected comes before the leadership is e2's to return (a hook
		// never sees a leadership that has not begun): Leader follows it.
		var lease *pglease.Lease
		require.Eventually(t, func() bool { l, ok := e2.Leader(); lease = l; return ok }, 2*time.Second, time.Millisecond)
		require.NoError(t, e2.IsLeader(ctx))
		require.Equal(t, second.Fence, lease.Fence())
	})

	t.Run("CallbacksInOrderOnceEachNeverAfterClose", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		log1, log2 := newCallLog(), newCallLog()
		e1 := recordingElector(t, pool, table, "e1", log1)
		e2 := recordingElector(t, pool, table, "e2", log2)

		l1, err := e1.Campaign(ctx)
		require.NoError(t, err)
		log1.waitFor(t, fmt.Sprintf("started %d leads=true", l1.Fence()), 5*time.Second)
		require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrHeld)
		log2.waitFor(t, "leader e1", 5*time.Second)

		// Close returns once the callbacks it queued have run, even if one
		// was running when it began.
		require.NoError(t, e1.Close(ctx))
		l2, err := e2.Campaign(ctx)
		require.NoError(t, err)
		log2.waitFor(t, fmt.Sprintf("started %d leads=true", l2.Fence()), 5*time.Second)
		require.NoError(t, e2.Close(ctx))
		require.NoError(t, e1.Close(ctx), "idempotent")

		require.Equal(t, []string{
			"leader e1",
			fmt.Sprintf("started %d leads=true", l1.Fence()),
			fmt.Sprintf("stopped %d", l1.Fence()),
		}, log1.all())
		require.Equal(t, []string{
			"leader e1",
			"leader e2",
			fmt.Sprintf("started %d leads=true", l2.Fence()),
			fmt.Sprintf("stopped %d", l2.Fence()),
		}, log2.all())
		require.ErrorIs(t, l1.Err(), pglease.ErrClosed)
		_, err = e2.Campaign(ctx)
		require.ErrorIs(t, err, pglease.ErrClosed)
		require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrClosed)
	})

	// Guarantee: callers waiting for the attempt that wins leadership, as
	// Close (from OnStartedLeading) resigns it at once, get that lease or
	// an error wrapping ErrClosed: never ErrLost, since nothing lost it.
	// Callers of Leader, as a service that polls it, contend for the
	// Elector's lock, so that Close often runs before a waiter reads.
	t.Run("CallersWaitingAsCloseResignsAWonLeadershipGetErrClosed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		for i := range 30 {
			key := fmt.Sprintf("k%d", i)
			leader := pgtest.Locker(t, pool, table, "leader")
			e1, err := pglease.NewElector(leader, key)
			require.NoError(t, err)
			require.NoError(t, e1.IsLeader(ctx))
			var e2 *pglease.Elector
			closed := make(chan error, 1)
			e2, err = pglease.NewElector(pgtest.Locker(t, pool, table, "follower"), key, pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
				OnStartedLeading: func(*pglease.Lease) { closed <- e2.Close(context.Background()) },
			}))
			require.NoError(t, err)
			require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrHeld)
			var (
				polling atomic.Bool
				wg      sync.WaitGroup
				got     = make(chan error, 4)
			)
			polling.Store(true)
			for range 4 {
				wg.Go(func() { _, err := e2.Campaign(ctx); got <- err })
				wg.Go(func() {
					for polling.Load() {
						e2.Leader()
					}
				})
			}
			require.NoError(t, e1.Close(ctx)) // the follower's campaign wins
			select {
			case err := <-closed:
				require.NoError(t, err)
			case <-time.After(10 * time.Second):
				t.Fatal("the follower was not elected")
			}
			require.NoError(t, e2.Close(ctx))
			polling.Store(false)
			wg.Wait()
			close(got)
			for err := range got {
				if err != nil {
					require.ErrorIs(t, err, pglease.ErrClosed, "round %d", i)
				}
			}
		}
	})

	// Guarantee: IsLeader answers ErrHeld at once while a lease of its own
	// Locker (a Claim of the leader key) holds the key: it does not wait
	// out its timeout for a campaign attempt that would report it.
	t.Run("IsLeaderWhileItsLockerHoldsTheKeyAnswersErrHeld", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica", pglease.WithTimeout(5*time.Second))
		_, err := l.Claim(ctx, "leader")
		require.NoError(t, err)
		e, err := pglease.NewElector(l, "leader")
		require.NoError(t, err)
		require.ErrorIs(t, e.IsLeader(ctx), pglease.ErrHeld, "not the end of IsLeader's timeout")
		_, ok := e.Leader()
		require.False(t, ok, "a lease of its Locker is no leadership of the Elector")
		require.NoError(t, e.Close(ctx))
	})

	t.Run("CloseWhileItsCampaignWaits", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		e1 := recordingElector(t, pool, table, "e1", newCallLog())
		e2 := recordingElector(t, pool, table, "e2", newCallLog())
		require.NoError(t, e1.IsLeader(ctx))
		campaign := make(chan error, 1)
		go func() {
			_, err := e2.Campaign(ctx)
			campaign <- err
		}()
		require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrHeld)
		closed := make(chan error, 1)
		go func() { closed <- e2.Close(ctx) }()
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("Close of a following Elector hangs")
		}
		select {
		case err := <-campaign:
			require.ErrorIs(t, err, pglease.ErrClosed)
		case <-time.After(5 * time.Second):
			t.Fatal("Campaign still waits after Close")
		}
		_, ok := e1.Leader()
		require.True(t, ok, "the leader is untouched")
	})

	// LeaderCallbacks may call the Elector, Close included. A follower that
	// gives up when it learns another replica leads (OnNewLeader), or a
	// leader that resigns from OnStartedLeading, calls Close from the
	// callback; Close must not wait for the callbacks' goroutine, which is
	// the one running it.
	t.Run("CloseCalledFromACallbackReturns", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)

		leader := newElector(t, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet)})
		require.NoError(t, leader.IsLeader(ctx))

		var follower *pglease.Elector
		closed := make(chan error, 1)
		follower = newElector(t, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("follower"), pglease.WithLogger(pgtest.Quiet)},
			pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
				OnNewLeader: func(holder string) {
					if holder != "follower" {
						closed <- follower.Close(context.Background()) // another replica leads: stand down
					}
				},
			}))
		require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Elector.Close called from OnNewLeader has not returned after 10s: it waits for the callback goroutine that runs it")
		}
	})

	// A leader that shuts its service down from OnStartedLeading closes the
	// Locker from the callback: that Close ends the Elector without waiting
	// for the goroutine it runs on, and returns.
	t.Run("LockerCloseCalledFromACallbackReturns", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "leader")
		closed := make(chan error, 1)
		stopped := make(chan struct{})
		idle, err := pglease.NewElector(l, "idle") // never campaigns
		require.NoError(t, err)
		first, err := pglease.NewElector(l, pglease.DefaultLeaderKey, pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStartedLeading: func(*pglease.Lease) { closed <- l.Close(context.Background()) },
			OnStoppedLeading: func(*pglease.Lease) { close(stopped) },
		}))
		require.NoError(t, err)
		// Campaign returns the lease, or, when the callback's Close ended
		// it first, says so.
		if _, err = first.Campaign(ctx); err != nil {
			require.ErrorIs(t, err, pglease.ErrClosed)
		}
		select {
		case err := <-closed:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("Locker.Close called from OnStartedLeading has not returned after 10s")
		}
		select {
		case <-stopped:
		case <-time.After(10 * time.Second):
			t.Fatal("OnStoppedLeading, due after the callback that closed the Locker, did not run")
		}
		require.ErrorIs(t, first.IsLeader(ctx), pglease.ErrClosed)
		require.ErrorIs(t, idle.IsLeader(ctx), pglease.ErrClosed)
	})

	// The callbacks still due run before Close returns, even when one runs
	// as Close begins: only a Close called from a callback itself returns
	// before them. Two goroutines close the same Elector while
	// OnStoppedLeading, which the first queued, runs: neither returns
	// before it has.
	t.Run("CloseWaitsForTheRunningCallback", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "leader")
		unblock := make(chan struct{})
		stoppedStarted := make(chan struct{})
		var stoppedDone atomic.Bool
		e, err := pglease.NewElector(l, pglease.DefaultLeaderKey,
			pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
				OnStoppedLeading: func(*pglease.Lease) {
					close(stoppedStarted)
					<-unblock
					stoppedDone.Store(true)
				},
			}))
		require.NoError(t, err)
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(unblock) }) })
		_, err = e.Campaign(ctx)
		require.NoError(t, err)

		first := make(chan error, 1)
		go func() { first <- e.Close(context.Background()) }()
		began(t, stoppedStarted, "OnStoppedLeading, queued by Close")
		second := make(chan error, 1)
		go func() { second <- e.Close(context.Background()) }()
		notReturned(t, first, "the first Close, while OnStoppedLeading, which it queued, still runs")
		notReturned(t, second, "a second Close, while OnStoppedLeading still runs")
		once.Do(func() { close(unblock) })
		require.NoError(t, <-first)
		require.NoError(t, <-second)
		require.True(t, stoppedDone.Load())
		require.NoError(t, l.Close(ctx))
	})

	// The Locker's Close, made while a callback of its Elector runs,
	// returns once that callback and the ones Close queued have run: when
	// it returns nil, nothing of the Locker runs (goleak, in TestMain).
	t.Run("LockerCloseWaitsForTheRunningCallback", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "leader")
		started, unblock := make(chan struct{}), make(chan struct{})
		var startedDone, stoppedRan atomic.Bool
		e, err := pglease.NewElector(l, pglease.DefaultLeaderKey,
			pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
				OnStartedLeading: func(*pglease.Lease) {
					close(started)
					<-unblock
					startedDone.Store(true)
				},
				OnStoppedLeading: func(*pglease.Lease) { stoppedRan.Store(true) },
			}))
		require.NoError(t, err)
		var once sync.Once
		t.Cleanup(func() { once.Do(func() { close(unblock) }) })
		_, err = e.Campaign(ctx)
		require.NoError(t, err)
		began(t, started, "OnStartedLeading")

		closed := make(chan error, 1)
		go func() { closed <- l.Close(context.Background()) }()
		notReturned(t, closed, "Locker.Close, while OnStartedLeading still runs")
		once.Do(func() { close(unblock) })
		require.NoError(t, <-closed)
		require.True(t, startedDone.Load(), "OnStartedLeading had returned")
		require.True(t, stoppedRan.Load(), "OnStoppedLeading, which Close queued, had run")
	})

	// The Elector's leadership lease is one of its Locker's leases: one
	// heartbeat statement per round extends it and a job's lease together,
	// each by its own TTL.
	t.Run("SharesTheLockersHeartbeat", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(3*time.Second),
			pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		e, err := pglease.NewElector(l, "leader", pglease.WithTTL(2*time.Second))
		require.NoError(t, err)
		job := mustJob(t, l, pglease.WithTTL(time.Minute))
		_, err = job.Claim(ctx, "job")
		require.NoError(t, err)
		leadership, err := e.Campaign(ctx)
		require.NoError(t, err)
		assert.Equal(t, l.Holder(), leadership.Holder(), "the Elector claims with its Locker's holder")
		counter.Reset()

		waitRounds(t, events, 3, 2) // rounds that extend both leases
		left := readTimes(t, pool, table, "leader").left
		assert.LessOrEqual(t, left, 2*time.Second, "extended by the Elector's own TTL, not the Locker's (3s)")
		assert.Greater(t, left, 2*time.Second-700*time.Millisecond, "extended by the Elector's own TTL")
		assert.Greater(t, readTimes(t, pool, table, "job").left, 50*time.Second, "the job's lease by the job's")
		require.NoError(t, l.Close(ctx))
		rounds := events.Count(pglease.EventExtended) + events.Count(pglease.EventHeartbeatFailed)
		beats := counter.Count("heartbeat")
		assert.GreaterOrEqual(t, beats, 3)
		assert.LessOrEqual(t, beats, rounds+1, "heartbeat statements %d for %d rounds: one per round for both leases", beats, rounds)
	})

	// Locker.Close first closes every Elector made from it: each resigns
	// and runs its callbacks before Close returns; no goroutine of theirs
	// outlives it (goleak, in TestMain).
	t.Run("LockerCloseEndsItsElectors", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-1")
		var stopped atomic.Int32
		cb := pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{OnStoppedLeading: func(*pglease.Lease) { stopped.Add(1) }})
		leading, err := pglease.NewElector(l, "a", cb)
		require.NoError(t, err)
		campaigning, err := pglease.NewElector(l, "b", cb)
		require.NoError(t, err)
		lease, err := leading.Campaign(ctx)
		require.NoError(t, err)
		other := pgtest.Locker(t, pool, table, "replica-2")
		_, err = other.Claim(ctx, "b")
		require.NoError(t, err)
		require.ErrorIs(t, campaigning.IsLeader(ctx), pglease.ErrHeld) // its campaign waits

		require.NoError(t, l.Close(ctx))
		assert.Equal(t, int32(1), stopped.Load(), "OnStoppedLeading ran before Locker.Close returned")
		require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
		row, _ := pgtest.ReadRow(t, pool, table, "a")
		assert.False(t, row.Live, "leadership released")
		require.ErrorIs(t, leading.IsLeader(ctx), pglease.ErrClosed)
		require.ErrorIs(t, campaigning.IsLeader(ctx), pglease.ErrClosed)
		_, err = pglease.NewElector(l, "c")
		require.ErrorIs(t, err, pglease.ErrClosed, "a closed Locker makes no Elector")
	})

	// Elector.Close resigns and stops campaigning; the Locker it was made
	// from stays open, its leases held.
	t.Run("CloseLeavesTheLockerOpen", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-1")
		held, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		e, err := pglease.NewElector(l, "leader")
		require.NoError(t, err)
		require.NoError(t, e.IsLeader(ctx))
		require.NoError(t, e.Close(ctx))
		require.NoError(t, held.Err(), "the Locker's own lease is untouched")
		_, err = l.Claim(ctx, "another")
		require.NoError(t, err, "the Locker still claims")
		again, err := pglease.NewElector(l, "leader")
		require.NoError(t, err, "a closed Elector's key is free for a new one")
		require.NoError(t, again.IsLeader(ctx))
	})

	t.Run("NewRefusesBadArguments", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(time.Second))
		_, err := pglease.NewElector(l, "leader")
		require.NoError(t, err)
		for _, c := range []struct {
			name   string
			locker *pglease.Locker
			key    string
			opts   []pglease.Option
			want   string
			option string // the invalid option the error names; "" for none
		}{
			{"nil locker", nil, "k", nil, "locker is nil", ""},
			{"empty key", l, "", nil, "key is empty", ""},
			{"key with NUL", l, "a\x00b", nil, "NUL byte", ""},
			{"key of an open Elector", l, "leader", nil, "has an open Elector for that key already", ""},
			{"TTL under twice the heartbeat", l, "k", []pglease.Option{pglease.WithTTL(1500 * time.Millisecond)}, "must be less than TTL/2", "WithTTL"},
			{"zero timeout", l, "k", []pglease.Option{pglease.WithTimeout(0)}, "WithTimeout(0s)", "WithTimeout"},
			{"zero Option", l, "k", []pglease.Option{{}}, "the zero Option", "Option"},
			{"min hold", l, "k", []pglease.Option{pglease.WithMinHold(time.Second)}, "WithMinHold does not apply to NewElector: an Elector has no min hold", "WithMinHold"},
		} {
			e, err := pglease.NewElector(c.locker, c.key, c.opts...)
			require.ErrorContains(t, err, c.want, c.name)
			assert.Nil(t, e, c.name)
			if c.option == "" {
				require.NotErrorIs(t, err, pglease.ErrInvalidOption, c.name)
				continue
			}
			assert.Equal(t, c.option, pglease.OptionNamed(err), c.name)
			require.ErrorIs(t, err, pglease.ErrInvalidOption, c.name)
		}
	})

	// A database error comes back from Campaign at once, wrapping the
	// driver's error, rather than being retried inside it until ctx ends.
	t.Run("CampaignReturnsDatabaseErrors", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		boom := errors.New("connection refused")
		db.SetFail("claim", boom)
		e := newElector(t, db, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet)})
		start := time.Now()
		_, err := e.Campaign(ctx)
		require.ErrorIs(t, err, boom)
		require.NotErrorIs(t, err, pglease.ErrHeld)
		assert.Less(t, time.Since(start), 5*time.Second, "returned at once, not at the end of ctx")

		db.SetFail("claim", nil)
		lease, err := e.Campaign(ctx) // what a loop does next
		require.NoError(t, err)
		require.NoError(t, lease.Err())
	})
}
