package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

type electedReplica struct {
	name    string
	db      *pgtest.FaultyDB
	elector *pglease.Elector
	sched   gocron.Scheduler
}

func TestElectorOneLeaderAtATimeAndFollowersTakeOverAfterCrashAndResign(t *testing.T) {
	t.Parallel()
	ctx, _, table := pgtest.Setup(t)
	const period, ttl = 200 * time.Millisecond, 1500 * time.Millisecond
	log := newRunLog()
	events := pgtest.NewEvents(t)
	var replicas []*electedReplica
	for i := range 3 {
		name := fmt.Sprintf("replica-%d", i+1)
		db := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
		e := pglease.NewElector(db, pglease.WithTable(table), pglease.WithHolder(name), pglease.WithLogger(pgtest.Quiet),
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(300*time.Millisecond), pglease.WithHook(events.Hook))
		t.Cleanup(func() { _ = e.Close(context.Background()) })
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

	leaderOf := func(after time.Time, limit time.Duration) run {
		t.Helper()
		deadline := time.After(limit)
		for {
			select {
			case x := <-log.started:
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

	first := leaderOf(time.Time{}, 5*time.Second)

	// Crash the leader: its database access stops dead, nothing is released.
	crashed := time.Now()
	dead := byName(first.replica)
	dead.db.Cut(errors.New("replica crashed"))
	go func() { _ = dead.sched.Shutdown() }()
	second := leaderOf(crashed, ttl+5*period)
	require.NotEqual(t, first.replica, second.replica)
	require.Greater(t, second.fence, first.fence)
	t.Logf("after a crash, %s led %v later (TTL %v)", second.replica, second.start.Sub(crashed), ttl)
	assert.Less(t, second.start.Sub(crashed), ttl+2*period, "a follower leads within one TTL")

	// The new leader resigns: a follower takes over without waiting for the TTL.
	resigned := time.Now()
	next := byName(second.replica)
	require.NoError(t, next.sched.Shutdown())
	require.NoError(t, next.elector.Close(ctx))
	third := leaderOf(resigned, ttl)
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
}

func TestElectorAnswersFromItsTrustWindowWithoutARoundTrip(t *testing.T) {
	t.Parallel()
	ctx, pool, table, counter := pgtest.SetupCounted(t)
	var mu sync.Mutex
	var elected []pglease.Event
	e := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderKey("leader-of-"+table), pglease.WithHook(func(ev pglease.Event) {
			if ev.Kind == pglease.EventElected {
				mu.Lock()
				elected = append(elected, ev)
				mu.Unlock()
			}
		}))
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	follower := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("b"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderKey("leader-of-"+table))
	t.Cleanup(func() { _ = follower.Close(context.Background()) })

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
	assert.Equal(t, "leader-of-"+table, elected[0].Key)
	mu.Unlock()

	require.NoError(t, e.Close(ctx))
	require.NoError(t, follower.IsLeader(ctx), "resigned: the follower leads at once")
}

func TestElectorHasNoMinHoldSoCloseHandsLeadershipOverAtOnce(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const key = "leader"
	leader := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderKey(key), pglease.WithTTL(time.Minute))
	t.Cleanup(func() { _ = leader.Close(context.Background()) })
	follower := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("b"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderKey(key), pglease.WithTTL(time.Minute))
	t.Cleanup(func() { _ = follower.Close(context.Background()) })

	require.NoError(t, leader.IsLeader(ctx))
	require.NoError(t, leader.Close(ctx))
	row, ok := pgtest.ReadRow(t, pool, table, key)
	require.True(t, ok)
	assert.False(t, row.Live, "resigned leadership expires at once (expires_at %v, acquired_at %v)", row.ExpiresAt, row.AcquiredAt)
	require.NoError(t, follower.IsLeader(ctx), "the follower leads at once")

	// A min hold is refused, not silently dropped: it would look like a
	// setting that holds.
	err := panicError(func() {
		_ = pglease.NewElector(pool, pglease.WithTable(table), pglease.WithTTL(time.Minute), pglease.WithMinHold(30*time.Second))
	})
	require.ErrorIs(t, err, pglease.ErrInvalidOption)
	require.ErrorContains(t, err, "WithMinHold does not apply to NewElector")
}

// A refused argument changes nothing: Close(nil) panics, naming the
// missing Context, before it closes anything, so that the Elector still
// leads, its campaign and callbacks still run, and a later Close resigns
// and returns with every goroutine gone. IsLeader and Campaign refuse a nil
// Context the same way.
func TestElectorRefusesANilContextBeforeChangingAnything(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	stopped := make(chan struct{})
	e := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet),
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
}

// A revoked leader key has no leader: its holder is the revoke marker
// (RevokedHolder), which no replica has. Neither the revoked leader nor a
// follower reports the marker as a new leader, by callback or event; the
// next leader they report is the replica that claims the key once the
// revoked lease has expired.
func TestElectorFollowersNeverReportTheRevokeMarkerAsALeader(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const key = "the-leader"
	events := pgtest.NewEvents(t)
	var mu sync.Mutex
	reported := map[string][]string{}
	elected := make(chan string, 2)
	elector := func(name string) *pglease.Elector {
		e := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder(name), pglease.WithLeaderKey(key),
			pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook),
			pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond),
			pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
				OnNewLeader: func(holder string) {
					mu.Lock()
					defer mu.Unlock()
					reported[name] = append(reported[name], holder)
				},
				OnStartedLeading: func(*pglease.Lease) { elected <- name },
			}))
		t.Cleanup(func() { _ = e.Close(context.Background()) })
		return e
	}
	a, b := elector("replica-a"), elector("replica-b")
	lease, err := a.Campaign(ctx)
	require.NoError(t, err)
	require.Equal(t, "replica-a", <-elected)
	require.ErrorIs(t, b.IsLeader(ctx), pglease.ErrHeld)

	rev, err := pglease.Revoke(ctx, pool, key, pglease.WithTable(table))
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
			assert.NotEqual(t, pglease.RevokedHolder, ev.Holder, "event %+v", ev)
		}
	}
}
