package fakedriver

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

// leaseOf is the lease a claim returned.
func leaseOf(key string, c driver.Claimed) driver.Lease {
	return driver.Lease{Key: key, Fence: c.Fence, Holder: c.Holder, AcquiredAt: c.AcquiredAt, TTL: time.Minute}
}

func TestDriver(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("AClaimThatBreaksTheCheckFailsWhole", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		_, ok, err := a.Claim(ctx, nil, "k", 0, 0)
		assert.False(t, ok)
		assert.True(t, driver.Is(err, "23514"), "CHECK (expires_at > acquired_at): %v", err)
		_, exists := tbl.Row("k")
		assert.False(t, exists)

		_, err = a.ClaimAll(ctx, nil, []string{"x", "y"}, []float64{60, -1}, 0)
		assert.True(t, driver.Is(err, "23514"), "%v", err)
		_, exists = tbl.Row("x")
		assert.False(t, exists, "a burst writes all its rows or none")

		c, ok, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		require.True(t, ok)
		assert.Equal(t, int64(4), c.Fence, "the fences the failed claims drew stay drawn, as a sequence's")
	})
	t.Run("ClaimAllDrawsFencesInTheKeysByteOrder", func(t *testing.T) {
		t.Parallel()
		a := NewTable().Protocol("a")
		got, err := a.ClaimAll(ctx, nil, []string{"b", "B", "a"}, []float64{60, 60, 60}, 0)
		require.NoError(t, err)
		assert.Equal(t, []int64{1, 2, 3}, []int64{got["B"].Fence, got["a"].Fence, got["b"].Fence})
	})
	t.Run("ClaimAllRefusesAKeyTwice", func(t *testing.T) {
		t.Parallel()
		_, err := NewTable().Protocol("a").ClaimAll(ctx, nil, []string{"k", "k"}, []float64{60, 60}, 0)
		assert.Error(t, err)
	})
	t.Run("AReentrantClaimKeepsTheRowsTickAndClearsItsRelease", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		took, err := a.ClaimTick(ctx, nil, "job", time.Minute, 0, driver.Ticks{Period: time.Hour})
		require.NoError(t, err)
		require.True(t, took.Took)
		m := leaseOf("job", took.Claimed)
		m.MinHold, m.Run = time.Minute, driver.RunCompleted
		_, err = a.ReleaseOne(ctx, nil, m)
		require.NoError(t, err)
		r, _ := tbl.Row("job")
		require.False(t, r.ReleasedAt.IsZero())

		_, ok, err := a.Claim(ctx, nil, "job", time.Minute, 0)
		require.NoError(t, err)
		require.True(t, ok)
		r, _ = tbl.Row("job")
		assert.Equal(t, took.Tick, r.Tick)
		assert.True(t, r.ReleasedAt.IsZero())
	})
	t.Run("AReleaseAfterTheClockSteppedBackKeepsTheRowPastItsAcquiredTime", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		tbl.Advance(-time.Second)
		got, err := a.ReleaseOne(ctx, nil, leaseOf("k", c))
		require.NoError(t, err)
		require.Equal(t, map[int]bool{0: true}, got)
		r, _ := tbl.Row("k")
		assert.Equal(t, c.AcquiredAt.Add(time.Microsecond), r.ExpiresAt)
		assert.True(t, r.Live, "held until the clock catches up with its acquired time")
	})
	t.Run("AReleaseClosesTheRunOfItsTick", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		took, err := a.ClaimTick(ctx, nil, "job", time.Minute, 0, driver.Ticks{Period: time.Hour})
		require.NoError(t, err)
		m := leaseOf("job", took.Claimed)
		m.Run = driver.RunFailed
		_, err = a.Release(ctx, nil, []driver.Lease{m})
		require.NoError(t, err)
		tbl.mu.Lock()
		outcome := tbl.runs[keyOfRun(took.Fence, took.Tick)]
		tbl.mu.Unlock()
		assert.Equal(t, driver.RunFailed, outcome)
	})
	t.Run("ConcurrentHoldersNeverShareALiveKeyAndNeverShareAFence", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		var (
			mu     sync.Mutex
			fences = map[int64]bool{}
			wg     sync.WaitGroup
		)
		for h := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				p := tbl.Protocol(fmt.Sprintf("h%d", h))
				held := map[string]driver.Claimed{}
				for range 300 {
					key := fmt.Sprintf("k%d", rand.N(5))
					switch rand.N(4) {
					case 0:
						tbl.Advance(time.Duration(rand.N(3)) * time.Second)
					case 1:
						if c, ok := held[key]; ok {
							if _, err := p.ReleaseOne(ctx, nil, leaseOf(key, c)); err != nil {
								t.Error(err)
							}
							delete(held, key)
						}
					default:
						c, ok, err := p.Claim(ctx, nil, key, 2*time.Second, 0)
						if err != nil {
							t.Error(err)
							return
						}
						if !ok {
							continue
						}
						held[key] = c
						mu.Lock()
						if fences[c.Fence] {
							t.Errorf("fence %d handed out twice", c.Fence)
						}
						fences[c.Fence] = true
						mu.Unlock()
						if r, _ := tbl.Row(key); r.Fence == c.Fence && r.Holder != p.holder {
							t.Errorf("the row of fence %d is %s's, not %s's", c.Fence, r.Holder, p.holder)
						}
					}
				}
			}()
		}
		wg.Wait()
		assert.NotEmpty(t, fences)
	})
}
