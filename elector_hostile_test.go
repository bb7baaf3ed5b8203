package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// Guarantee 6 (NewElector ignores WithMinHold, so Close hands
// leadership over at once): the min hold is given several times, before and
// after other options; the follower must be elected at its first IsLeader
// after the leader's Close.
func TestElectorCloseHandsOverAtOnceWhateverMinHoldIsGiven(t *testing.T) {
	t.Parallel()
	ctx := ctxT(t)
	pool := newPool(t, "", nil)
	table := newTable(t, pool)
	opts := func(holder string) []pglease.Option {
		return []pglease.Option{pglease.WithMinHold(9 * time.Second), pglease.WithTable(table), pglease.WithTTL(10 * time.Second),
			pglease.WithMinHold(10 * time.Second), pglease.WithHolder(holder), pglease.WithLogger(quiet), pglease.WithMinHold(5 * time.Second)}
	}
	leader := pglease.NewElector(pool, opts("leader")...)
	follower := pglease.NewElector(pool, opts("follower")...)
	t.Cleanup(func() { _ = follower.Close(ctx) })
	require.NoError(t, leader.IsLeader(ctx))
	require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
	require.NoError(t, leader.Close(ctx))
	start := time.Now()
	require.NoError(t, follower.IsLeader(ctx), "the follower is elected at its first try after the leader's Close")
	t.Logf("figures: follower elected %v after the leader's Close", time.Since(start))
}
