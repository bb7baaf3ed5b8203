package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: "a caller whose context ends gets an error and a row it won
// anyway is given back" together with "a re-entrant claim ... the previous
// lease must be lost". When the orphaned claim was re-entrant (this Locker
// already held key), the orphan's release frees the row while the previous
// Lease is still registered and trusted: another holder then takes the key
// while Held still hands out the previous Lease. A claim sent alone and
// cancelled after commit leaves the row ours until its expiry, later than
// the previous lease's, so the overlap is new with coalescing.
func TestOrphanedReentrantClaimInBurstNeverFreesTheKeyUnderATrustedPreviousLease(t *testing.T) {
	ctx, pool, table := pgtest.Setup(t)
	f := pgtest.NewFaultyDB(pool)
	events := pgtest.NewEvents(t)
	a := pgtest.Locker(t, f, table, "a", pglease.WithTTL(30*time.Second), pglease.WithHook(events.Hook))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(30*time.Second))

	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)

	release := f.Hold("claim")
	defer release()
	kctx, cancelK := context.WithCancel(ctx)
	defer cancelK()
	send := pglease.PrepareClaimBurst([]context.Context{kctx, ctx}, a, []string{"k", "x"})
	type result struct {
		leases []*pglease.Lease
		errs   []error
	}
	got := make(chan result, 1)
	go func() { ls, es := send(); got <- result{ls, es} }()
	select {
	case <-f.Entered: // the burst's statement is on its way
	case <-ctx.Done():
		t.Fatal("burst never sent")
	}
	cancelK()                                                         // the caller of k gives up while its claim is in the statement
	ev := events.WaitFor(t, pglease.EventClaimFailed, 10*time.Second) // Claim(k) has returned its error
	require.Equal(t, "k", ev.Key)
	release()
	r := <-got
	require.Error(t, r.errs[0], "the cancelled re-entrant claim reports an error")
	require.NoError(t, r.errs[1])

	// Wait until the orphan's release has expired row k.
	deadline := time.Now().Add(10 * time.Second)
	for {
		row, ok := pgtest.ReadRow(t, pool, table, "k")
		require.True(t, ok)
		if !row.Live {
			break
		}
		if time.Now().After(deadline) {
			t.Logf("row k still live (holder %s fence %d): the orphan did not release it", row.Holder, row.Fence)
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	other, err := b.Claim(ctx, "k")
	require.NoError(t, err, "another holder takes k once the orphan freed it")
	held, ok := a.Held("k")
	if ok || first.Err() == nil {
		t.Fatalf("mutual exclusion broken: b holds k (fence %d) while a's previous lease (fence %d) is still trusted: Held=%v Err=%v",
			other.Fence(), first.Fence(), ok && held == first, first.Err())
	}
	require.ErrorIs(t, first.Err(), pglease.ErrLost)
}
