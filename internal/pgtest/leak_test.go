package pgtest

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// recorder is a testing.TB that keeps its errors instead of failing.
type recorder struct {
	testing.TB
	mu     sync.Mutex
	errors []string
}

func (r *recorder) Helper() {}

func (r *recorder) Errorf(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.errors = append(r.errors, strings.TrimSpace(fmt.Sprintf(format, args...)))
}

// testGrace is the grace of these tests: long for the goroutines that end,
// short for a test.
const testGrace = 500 * time.Millisecond

func TestNoGoroutineLeft(t *testing.T) {
	t.Run("GoroutinesThatEndInTimePass", func(t *testing.T) {
		r := &recorder{TB: t}
		noGoroutineLeft(context.Background(), r, testGrace, func(context.Context) {
			go func() {
				go func() { time.Sleep(50 * time.Millisecond) }() // a goroutine of a goroutine
				time.Sleep(100 * time.Millisecond)
			}()
		})
		require.Empty(t, r.errors)
	})

	t.Run("AGoroutineThatOutlivesTheGraceFails", func(t *testing.T) {
		r := &recorder{TB: t}
		stop := make(chan struct{})
		defer close(stop)
		started := time.Now()
		noGoroutineLeft(context.Background(), r, testGrace, func(context.Context) {
			go func() {
				go func() { <-stop }() // only the inner one stays
			}()
		})
		require.GreaterOrEqual(t, time.Since(started), testGrace, "it waited its grace")
		require.Len(t, r.errors, 1)
		require.Contains(t, r.errors[0], "TestNoGoroutineLeft", "the stack of the goroutine left")
	})

	t.Run("GoroutinesOfOtherCallsAreNotCounted", func(t *testing.T) {
		stop := make(chan struct{})
		defer close(stop)
		go func() { <-stop }() // started by the test, outside the call
		outside := &recorder{TB: t}
		noGoroutineLeft(context.Background(), outside, testGrace, func(context.Context) {
			go func() { <-stop }() // another call's, still running
		})
		require.Len(t, outside.errors, 1)
		r := &recorder{TB: t}
		noGoroutineLeft(context.Background(), r, testGrace, func(context.Context) {})
		require.Empty(t, r.errors, "the goroutines of the test and of another call are not this call's")
	})
}
