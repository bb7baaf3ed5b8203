package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: LeaderCallbacks may call the Elector, Close included. A
// follower that gives up when it learns another replica leads
// (OnNewLeader), or a leader that resigns from OnStartedLeading, calls Close
// from the callback; Close must not wait for the callbacks' goroutine, which
// is the one running it.
func TestElectorCloseCalledFromALeaderCallbackReturns(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)

	leader := pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet))
	t.Cleanup(func() { _ = leader.Close(context.Background()) })
	require.NoError(t, leader.IsLeader(ctx))

	var follower *pglease.Elector
	closed := make(chan error, 1)
	follower = pglease.NewElector(pool, pglease.WithTable(table), pglease.WithHolder("follower"), pglease.WithLogger(pgtest.Quiet),
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
}
