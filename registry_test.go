package pglease

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRegistry checks what a Locker holds, with no database: the newest
// lease of each key, the releases on their way, the fences it remembers,
// the heartbeat the first lease starts, and Close's one step after which
// nothing joins.
func TestRegistry(t *testing.T) {
	t.Parallel()
	lease := func(key string, fence int64) *Lease {
		return &Lease{key: key, fence: fence, terms: terms{ttl: time.Minute}}
	}
	t.Run("NewestLeasePerKey", func(t *testing.T) {
		t.Parallel()
		var r registry
		var hb heartbeats
		a1, a2, b := lease("a", 1), lease("a", 2), lease("b", 3)
		prev, err := r.add(a1, hb.beat)
		require.NoError(t, err)
		assert.Nil(t, prev)
		prev, err = r.add(a2, hb.beat)
		require.NoError(t, err)
		assert.Same(t, a1, prev, "the lease replaced")
		_, err = r.add(b, hb.beat)
		require.NoError(t, err)
		assert.Same(t, a2, r.get("a"))
		assert.ElementsMatch(t, []*Lease{a2, b}, r.all())

		r.remove(a1) // no longer the newest: nothing changes
		assert.Same(t, a2, r.get("a"))
		r.remove(a2)
		assert.Nil(t, r.get("a"))
		assert.True(t, r.any())
		r.remove(b)
		assert.False(t, r.any(), "no lease held")

		assert.Empty(t, r.all())
		done := r.stopHeartbeat()
		require.NotNil(t, done, "the first lease started the heartbeat")
		<-done
		assert.Equal(t, 1, hb.started(), "one heartbeat for every lease")
	})

	t.Run("ReleasesInFlightByLease", func(t *testing.T) {
		t.Parallel()
		var r registry
		_, ok := r.releaseOf("k")
		assert.False(t, ok, "no release on its way")
		superseded, successor := lease("k", 1), lease("k", 2)
		r.releaseStarted(superseded)
		r.releaseStarted(successor)
		require.Len(t, r.releasesInFlight(), 2, "two releases of one key, both waited for")
		first := r.releasesInFlight()
		r.releaseFinished(successor)
		done, ok := r.releaseOf("k")
		require.True(t, ok, "the superseded lease's release is still on its way")
		select {
		case <-done:
			t.Fatal("the release on its way reads as finished")
		default:
		}
		require.Len(t, r.releasesInFlight(), 1)
		r.releaseFinished(superseded)
		<-done
		for _, d := range first {
			<-d // each one waited for has finished
		}
		_, ok = r.releaseOf("k")
		assert.False(t, ok)
		assert.Empty(t, r.releasesInFlight())
		r.releaseFinished(superseded) // twice: nothing to end
	})

	t.Run("LocksNothingUnderItsOwn", func(t *testing.T) {
		t.Parallel()
		// An Elector holds its mu while it reads its lease (Lease.Err), a
		// release holds the Lease's while it records itself here: were the
		// registry to lock an Elector under its own, the three would wait
		// on one another.
		var r registry
		busy := &Elector{key: "busy"}
		require.NoError(t, r.addElector(busy, "busy"))
		busy.mu.Lock()
		defer busy.mu.Unlock()
		added := make(chan error, 1)
		go func() { added <- r.addElector(&Elector{key: "busy"}, "busy") }()
		select {
		case err := <-added:
			require.ErrorContains(t, err, "open Elector for that key")
		case <-time.After(10 * time.Second):
			t.Fatal("addElector waits for another Elector's lock")
		}
	})

	t.Run("NothingJoinsAfterClose", func(t *testing.T) {
		t.Parallel()
		var r registry
		var hb heartbeats
		kept := lease("kept", 1)
		_, err := r.add(kept, hb.beat)
		require.NoError(t, err)
		e := &Elector{key: "leader"}
		require.NoError(t, r.addElector(e, "leader"))
		require.ErrorContains(t, r.addElector(&Elector{key: "leader"}, "leader"), "open Elector for that key")
		require.NoError(t, r.addElector(&Elector{key: "other"}, "other"))

		ctx := context.Background()
		electors, first := r.close(ctx, time.Now().Add(time.Minute))
		require.True(t, first)
		assert.Len(t, electors, 2, "Close takes every Elector")
		assert.Contains(t, electors, e)
		_, again := r.close(ctx, time.Now().Add(time.Minute))
		assert.False(t, again, "a second Close is not the first")
		assert.True(t, r.isClosed())
		closeCtx, _ := r.closing()
		assert.Equal(t, ctx, closeCtx)
		assert.False(t, r.any(), "the watchdog stops once Close has begun")

		_, err = r.add(lease("late", 2), hb.beat)
		require.ErrorIs(t, err, ErrClosed)
		assert.Nil(t, r.get("late"))
		require.ErrorIs(t, r.addElector(&Elector{key: "late"}, "late"), ErrClosed)

		assert.Equal(t, []*Lease{kept}, r.all())
		<-r.stopHeartbeat()
		assert.Nil(t, (&registry{}).stopHeartbeat(), "no heartbeat to stop before the first lease")
	})

	t.Run("FirstTimeOnly", func(t *testing.T) {
		t.Parallel()
		var r registry
		assert.True(t, r.first("unnamed\x00job"))
		assert.False(t, r.first("unnamed\x00job"))
		assert.True(t, r.first("unnamed\x00other"))
	})

	t.Run("GivenUpForClose", func(t *testing.T) {
		t.Parallel()
		var r registry
		assert.Empty(t, r.givenUpErrs())
		r.giveUp(ErrLost)
		errs := r.givenUpErrs()
		require.Len(t, errs, 1)
		require.ErrorIs(t, errs[0], ErrLost)
		errs[0] = nil // a copy: the registry's stays
		require.ErrorIs(t, r.givenUpErrs()[0], ErrLost)
	})
}

// heartbeats counts the heartbeats a registry starts; each runs until
// stopped.
type heartbeats struct {
	mu sync.Mutex
	n  int
}

func (h *heartbeats) beat(ctx context.Context, done chan<- struct{}) {
	h.mu.Lock()
	h.n++
	h.mu.Unlock()
	<-ctx.Done()
	close(done)
}

func (h *heartbeats) started() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.n
}
