package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: "no goroutine outlives Close". A claim whose caller gave up
// while its burst statement was in flight is given back by the
// coalescer's goroutine after the statement returns (orphanClaim). Close
// waits for that give-back: it returns only once the row is released, and
// no statement of the Locker runs after it.
func TestOrphanReleaseOfABurstClaimNeverRunsAfterClose(t *testing.T) {
	ctx, pool, table := pgtest.Setup(t)
	f := pgtest.NewFaultyDB(pool)
	events := pgtest.NewEvents(t)
	a := pglease.NewLocker(f, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook))
	b := pgtest.Locker(t, pool, table, "b")
	_, err := b.Claim(ctx, "x") // x is held elsewhere: its claim in the burst wins nothing
	require.NoError(t, err)

	releaseClaims := f.Hold("claim")
	defer releaseClaims()
	kctx, cancelK := context.WithCancel(ctx)
	defer cancelK()
	send := pglease.PrepareClaimBurst([]context.Context{kctx, ctx}, a, []string{"k", "x"})
	done := make(chan struct{})
	go func() { send(); close(done) }()
	<-f.Entered
	cancelK()
	ev := events.WaitFor(t, pglease.EventClaimFailed, 10*time.Second)
	require.Equal(t, "k", ev.Key)
	releaseReleases := f.Hold("release") // the orphan's give-back will wait here
	defer releaseReleases()
	releaseClaims()
	<-done // x: ErrHeld; k: orphaned, won, and being given back
	select {
	case <-f.Entered:
	case <-ctx.Done():
		t.Fatal("the orphan's release never came")
	}
	closeErr := make(chan error, 1)
	go func() { closeErr <- a.Close(ctx) }() // a holds no lease of its own
	select {
	case err := <-closeErr:
		t.Fatalf("Close returned (%v) while the orphan's give-back was still in its statement", err)
	case <-time.After(300 * time.Millisecond):
	}
	releaseReleases()
	require.NoError(t, <-closeErr)
	row, _ := pgtest.ReadRow(t, pool, table, "k")
	require.False(t, row.Live, "the orphan's give-back of k (fence %d) ran before Close returned", row.Fence)
}
