package driver

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestClosings checks, with no server, the wait Close makes for the
// connections closed after a cancel; the root's TestClaimCancel proves the
// cancel itself against PostgreSQL.
func TestClosings(t *testing.T) {
	t.Parallel()
	t.Run("WaitsForEveryCleanUp", func(t *testing.T) {
		t.Parallel()
		var c Closings
		first, second := make(chan struct{}), make(chan struct{})
		c.add(first)
		c.add(second)
		close(first)
		waited := make(chan error, 1)
		go func() { waited <- c.Wait(context.Background()) }()
		select {
		case err := <-waited:
			t.Fatalf("Wait returned %v before the second clean-up ended", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(second)
		if err := <-waited; err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	t.Run("StopsWaitingWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		var c Closings
		c.add(make(chan struct{}))
		ctx, cancel := context.WithCancelCause(context.Background())
		cause := errors.New("Close's deadline")
		cancel(cause)
		if err := c.Wait(ctx); !errors.Is(err, cause) {
			t.Errorf("Wait = %v, want an error wrapping %v", err, cause)
		}
	})
	t.Run("WaitsAgainForWhatAnEndedWaitLeft", func(t *testing.T) {
		t.Parallel()
		var c Closings
		left := make(chan struct{})
		c.add(left)
		ended, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.Wait(ended); err == nil {
			t.Fatal("Wait under an ended context returned nil with a clean-up running")
		}
		waited := make(chan error, 1)
		go func() { waited <- c.Wait(context.Background()) }()
		select {
		case err := <-waited:
			t.Fatalf("the second Wait returned %v before the clean-up ended", err)
		case <-time.After(50 * time.Millisecond):
		}
		close(left)
		if err := <-waited; err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	// Run with -race: a Wait reads the clean-ups while statements add more
	// (an Unlock whose connection is dropped as Close waits).
	t.Run("WaitsWhileCleanUpsAreAdded", func(t *testing.T) {
		t.Parallel()
		var c Closings
		running := make(chan struct{})
		for range 8 {
			done := make(chan struct{})
			close(done)
			c.add(done)
		}
		c.add(running)
		waited := make(chan error, 1)
		go func() { waited <- c.Wait(context.Background()) }()
		time.Sleep(20 * time.Millisecond) // Wait has read the list and waits
		// Each add keeps the running clean-up and drops those that ended.
		for range 64 {
			done := make(chan struct{})
			close(done)
			c.add(done)
		}
		close(running)
		if err := <-waited; err != nil {
			t.Errorf("Wait: %v", err)
		}
	})
	t.Run("ForgetsCleanUpsThatEnded", func(t *testing.T) {
		t.Parallel()
		var c Closings
		for range 3 {
			done := make(chan struct{})
			close(done)
			c.add(done)
		}
		if len(c.done) != 1 {
			t.Errorf("%d clean-ups kept, want only the last added", len(c.done))
		}
	})
	t.Run("WithoutAConnectionTheStatementRunsOnTheCallersContext", func(t *testing.T) {
		t.Parallel()
		caller, cancel := context.WithCancelCause(context.Background())
		a := Answer(caller, nil, true, new(Closings))
		if a.Ctx() != caller {
			t.Fatal("the statement's context is not the caller's")
		}
		cause := errors.New("the caller gave up")
		cancel(cause)
		if err := a.End(errors.New("canceling statement")); !errors.Is(err, cause) {
			t.Errorf("End = %v, want an error naming %v", err, cause)
		}
	})
}
