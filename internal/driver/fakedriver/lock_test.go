package fakedriver

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

func TestLock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AClaimWaitsForTheLockOfARowItTakes", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a, b := tbl.Protocol("a"), tbl.Protocol("b")
		first, _, err := a.Claim(ctx, nil, "k", time.Second, 0)
		require.NoError(t, err)
		tbl.Advance(time.Second)
		unlock := tbl.Lock("k")
		type claimed struct {
			c   driver.Claimed
			ok  bool
			err error
		}
		out := make(chan claimed, 1)
		go func() {
			c, ok, err := b.Claim(ctx, nil, "k", time.Minute, 0)
			out <- claimed{c, ok, err}
		}()
		select {
		case got := <-out:
			t.Fatalf("the claim went through a locked row: %+v", got)
		case <-time.After(20 * time.Millisecond):
		}
		tbl.Advance(time.Minute)
		unlock()
		got := <-out
		require.NoError(t, got.err)
		require.True(t, got.ok)
		assert.Equal(t, first.Fence+1, got.c.Fence, "no fence drawn while it waited")
		assert.Equal(t, Start.Add(time.Second+time.Minute+time.Microsecond), got.c.AcquiredAt, "judged on the clock after the wait")
	})
	t.Run("AClaimWithALockWaitFailsOnceItPasses", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		_, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		defer tbl.Lock("k")()
		_, ok, err := a.Claim(ctx, nil, "k", time.Minute, 10*time.Millisecond)
		assert.False(t, ok)
		assert.True(t, driver.Is(err, driver.LockNotAvailable), "%v", err)
		_, err = a.ClaimTick(ctx, nil, "k", time.Minute, 10*time.Millisecond, driver.Ticks{Period: time.Hour})
		assert.True(t, driver.Is(err, driver.LockNotAvailable), "%v", err)
		_, err = a.ClaimAll(ctx, nil, []string{"free", "k"}, []float64{60, 60}, 0)
		assert.True(t, driver.Is(err, driver.LockNotAvailable), "a burst waits 1ms at least: %v", err)
		_, exists := tbl.Row("free")
		assert.False(t, exists, "a burst that failed wrote nothing")
	})
	t.Run("AClaimWaitingForALockEndsWithItsContext", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		_, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		defer tbl.Lock("k")()
		short, cancel := context.WithTimeout(ctx, 10*time.Millisecond)
		defer cancel()
		_, _, err = a.Claim(short, nil, "k", time.Minute, 0)
		require.ErrorIs(t, err, context.DeadlineExceeded)
	})
	t.Run("ALockOfAKeyWithoutARowHoldsNothing", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		unlock := tbl.Lock("k")
		_, ok, err := tbl.Protocol("a").Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		assert.True(t, ok)
		unlock()
	})
}
