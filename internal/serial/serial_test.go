package serial_test

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/serial"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// within fails t unless done is closed within a bound no correct run
// comes near.
func within(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal(what)
	}
}

func TestQueue(t *testing.T) {
	t.Parallel()

	t.Run("WaitEndsWithItsContext", func(t *testing.T) {
		t.Parallel()
		var q serial.Queue
		q.Start()
		release := make(chan struct{})
		q.Push(func() { <-release })
		q.Close()
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		require.ErrorIs(t, q.Wait(ctx), context.DeadlineExceeded, "a callback that never returns holds Wait until its context ends")
		close(release)
		require.NoError(t, q.Wait(context.Background()))
	})

	t.Run("RunsInOrderOneAtATime", func(t *testing.T) {
		t.Parallel()
		var (
			q       serial.Queue
			mu      sync.Mutex
			got     []int
			inside  atomic.Int32
			overlap atomic.Bool
		)
		q.Start()
		for i := range 100 {
			q.Push(func() {
				if inside.Add(1) > 1 {
					overlap.Store(true)
				}
				mu.Lock()
				got = append(got, i)
				mu.Unlock()
				inside.Add(-1)
			})
		}
		q.Close()
		_ = q.Wait(context.Background())
		require.False(t, overlap.Load(), "two callbacks ran at once")
		require.Len(t, got, 100, "every callback queued before Close ran")
		for i, v := range got {
			require.Equal(t, i, v, "callbacks ran out of order")
		}
	})

	t.Run("PushUnderALockTheCallbackTakes", func(t *testing.T) {
		t.Parallel()
		var (
			q  serial.Queue
			mu sync.Mutex
		)
		q.Start()
		ran := make(chan struct{})
		mu.Lock()
		q.Push(func() {
			mu.Lock()
			defer mu.Unlock()
			close(ran)
		})
		mu.Unlock()
		within(t, ran, "the callback never ran")
		q.Close()
		_ = q.Wait(context.Background())
	})

	t.Run("QueuedBeforeStartRunOnceStarted", func(t *testing.T) {
		t.Parallel()
		var q serial.Queue
		ran := make(chan struct{})
		q.Push(func() { close(ran) })
		q.Start()
		q.Start() // once
		within(t, ran, "the callback queued before Start never ran")
		q.Close()
		_ = q.Wait(context.Background())
	})

	t.Run("CallingOnlyOnItsGoroutine", func(t *testing.T) {
		t.Parallel()
		var q, other serial.Queue
		require.False(t, q.Calling(), "before Start")
		q.Start()
		other.Start()
		entered, release := make(chan struct{}), make(chan struct{})
		var inside, fromOther atomic.Bool
		q.Push(func() { inside.Store(q.Calling()); close(entered); <-release })
		within(t, entered, "the callback never ran")
		require.True(t, inside.Load(), "a callback of q")
		require.False(t, q.Calling(), "another goroutine, while a callback of q runs")
		asked := make(chan struct{})
		other.Push(func() { fromOther.Store(q.Calling()); close(asked) })
		within(t, asked, "the other queue's callback never ran")
		require.False(t, fromOther.Load(), "a callback of another queue, while one of q runs")
		close(release)
		q.Close()
		other.Close()
		_ = q.Wait(context.Background())
		_ = other.Wait(context.Background())
		require.False(t, q.Calling(), "after the goroutine returned")
	})

	t.Run("CloseFromACallbackDoesNotWaitForItself", func(t *testing.T) {
		t.Parallel()
		var q serial.Queue
		q.Start()
		closed := make(chan struct{})
		q.Push(func() {
			q.Close()
			if !q.Calling() {
				_ = q.Wait(context.Background()) // would wait for itself
			}
			close(closed)
		})
		within(t, closed, "Close from a callback did not return")
		_ = q.Wait(context.Background())
	})

	t.Run("WaitWithoutStartReturns", func(t *testing.T) {
		t.Parallel()
		var q serial.Queue
		q.Push(func() {})
		q.Close()
		_ = q.Wait(context.Background())
	})

	t.Run("ClosedWhileACallbackRunsStillRunsWhatWasQueued", func(t *testing.T) {
		t.Parallel()
		var q serial.Queue
		q.Start()
		entered, release := make(chan struct{}), make(chan struct{})
		var after atomic.Bool
		q.Push(func() { close(entered); <-release })
		within(t, entered, "the first callback never ran")
		q.Push(func() { after.Store(true) })
		q.Close()
		close(release)
		_ = q.Wait(context.Background())
		require.True(t, after.Load(), "a callback queued before Close did not run")
	})
}
