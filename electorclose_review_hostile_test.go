package pglease_test

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: the callbacks still due run before Close returns, whichever
// Close it is: two goroutines close the same Elector (a signal handler and
// a deferred Close, say), and the second Close returns only once
// OnStoppedLeading, queued by the first, has run.
func TestElectorSecondConcurrentCloseReturnsOnlyAfterTheCallbacks(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)

	unblock := make(chan struct{})
	stoppedStarted := make(chan struct{})
	var stoppedDone atomic.Bool
	e := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{
			OnStoppedLeading: func(*pglease.Lease) {
				close(stoppedStarted)
				<-unblock
				stoppedDone.Store(true)
			},
		}))
	t.Cleanup(func() {
		select {
		case <-unblock:
		default:
			close(unblock)
		}
	})
	_, err := e.Campaign(ctx)
	require.NoError(t, err)

	first := make(chan error, 1)
	go func() { first <- e.Close(context.Background()) }()
	select {
	case <-stoppedStarted:
	case <-time.After(10 * time.Second):
		t.Fatal("OnStoppedLeading did not start within 10s of Close")
	}

	second := make(chan error, 1)
	go func() { second <- e.Close(context.Background()) }()
	select {
	case err := <-second:
		require.NoError(t, err)
		require.True(t, stoppedDone.Load(), "the second Close returned while OnStoppedLeading was still running: Close promises the callbacks still due have run before it returns")
	case <-time.After(500 * time.Millisecond):
		// The second Close waits for the callbacks: what is promised.
	}
	close(unblock)
	require.NoError(t, <-first)
	select {
	case err := <-second:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("the second Close did not return after the callbacks ended")
	}
}
