package fakedriver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

// within waits for ch, failing the test after a few seconds.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(5 * time.Second):
		t.Fatalf("%s never happened", what)
	}
}

type extended struct {
	got map[int]driver.Extension
	err error
}

func extendInBackground(ctx context.Context, p *Driver, ms []driver.Lease) <-chan extended {
	out := make(chan extended, 1)
	go func() {
		got, err := p.Extend(ctx, nil, ms)
		out <- extended{got, err}
	}()
	return out
}

func TestHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AHeartbeatHeldBeforeItRunsComesAfterTheRelease", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		m := leaseOf("k", c)
		m.MinHold = time.Minute

		gate := a.Hold(Extend, false)
		round := extendInBackground(ctx, a, []driver.Lease{m})
		within(t, gate.Arrived(), "the heartbeat's arrival")
		got, err := a.ReleaseOne(ctx, nil, m)
		require.NoError(t, err)
		require.Equal(t, map[int]bool{0: true}, got)
		r, _ := tbl.Row("k")
		releasedUntil := r.ExpiresAt
		gate.Open()

		res := <-round
		require.NoError(t, res.err)
		assert.Contains(t, res.got, 0, "within its min hold the released row still matches the heartbeat")
		r, _ = tbl.Row("k")
		assert.True(t, r.ExpiresAt.After(releasedUntil), "the heartbeat that came after re-armed the released row")
	})
	t.Run("AReleaseHeldAfterItRanHasWrittenBeforeItsCallerKnows", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)

		gate := a.Hold(ReleaseOne, true)
		done := make(chan map[int]bool, 1)
		go func() {
			got, _ := a.ReleaseOne(ctx, nil, leaseOf("k", c))
			done <- got
		}()
		within(t, gate.Arrived(), "the release's arrival")
		r, _ := tbl.Row("k")
		assert.False(t, r.Live, "written")
		select {
		case <-done:
			t.Fatal("the reply came through a closed gate")
		default:
		}
		gate.Open()
		assert.Equal(t, map[int]bool{0: true}, <-done)
	})
	t.Run("AStatementHeldUntilItsContextEndsWritesNothing", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		ctx, cancel := context.WithCancel(ctx)
		gate := a.Hold(Claim, false)
		out := make(chan error, 1)
		go func() {
			_, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
			out <- err
		}()
		within(t, gate.Arrived(), "the claim's arrival")
		cancel()
		err := <-out
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, driver.Unknown, driver.OutcomeOf(err), "sent, and its answer never read")
		_, exists := tbl.Row("k")
		assert.False(t, exists)
	})
}
