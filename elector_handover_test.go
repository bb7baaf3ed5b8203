package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

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
		OnNewLeader:      func(h string) { log.add("leader " + h) },
	}
	all := append([]pglease.Option{pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderCallbacks(cb)}, opts...)
	e = pglease.NewElector(db, all...)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e
}

func TestElectorFollowerTakesOverAtTheLeadersCloseWithoutAnotherIsLeader(t *testing.T) {
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
	require.Equal(t, "e2", second.Holder)
	require.Greater(t, second.Fence, first.Fence())
	lease, ok := e2.Leader()
	require.True(t, ok)
	require.NoError(t, e2.IsLeader(ctx))
	require.Equal(t, second.Fence, lease.Fence())
}

func TestLeaderCallbacksFireInOrderOnceEachAndNeverAfterClose(t *testing.T) {
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
}

func TestElectorCloseWhileItsCampaignWaitsReturnsPromptly(t *testing.T) {
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
}
