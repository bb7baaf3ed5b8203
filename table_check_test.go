package pglease

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// TestTableCheck is the state of a Locker's check of its table, without
// a database: a check that passed stands for its interval, then a claim
// checks again; one that failed stands for nothing; one read at a time.
func TestTableCheck(t *testing.T) {
	t.Run("StandsForItsInterval", func(t *testing.T) {
		c := tableCheck{every: 50 * time.Millisecond}
		if c.fresh() {
			t.Fatal("fresh before any check passed")
		}
		passed := time.Now()
		c.passed.Store(&passed)
		if !c.fresh() {
			t.Fatal("not fresh just after a check passed")
		}
		time.Sleep(60 * time.Millisecond)
		if c.fresh() {
			t.Fatal("fresh past its interval")
		}
		c.passed.Store(&passed)
		c.every = 0
		if c.fresh() {
			t.Fatal("fresh with an interval of 0: every claim checks")
		}
		c.every = time.Hour
		c.passed.Store(nil) // a check that failed
		if c.fresh() {
			t.Fatal("fresh after a check that failed")
		}
	})
	t.Run("ReadsOnceWhileAPassStandsAndAgainAfterAFailure", func(t *testing.T) {
		var reads atomic.Int32
		fail := errors.New("refused")
		var next error
		c := newTableCheck(func(context.Context) error { reads.Add(1); return next })
		ctx := context.Background()
		next = fail
		if err := c.check(ctx); !errors.Is(err, fail) {
			t.Fatalf("a refused read: %v", err)
		}
		next = nil
		for range 3 {
			if err := c.check(ctx); err != nil {
				t.Fatal(err)
			}
		}
		if got := reads.Load(); got != 2 {
			t.Fatalf("%d reads: want 2, one refused and one that passed and stands", got)
		}
	})

	t.Run("OneReadAtATime", func(t *testing.T) {
		entered, release := make(chan struct{}), make(chan struct{})
		var reads atomic.Int32
		c := newTableCheck(func(context.Context) error {
			if reads.Add(1) == 1 {
				close(entered)
				<-release
			}
			return nil
		})
		first := make(chan error, 1)
		go func() { first <- c.check(context.Background()) }()
		<-entered
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if err := c.check(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("a check waiting for the read in flight, its context ended: %v", err)
		}
		second := make(chan error, 1)
		go func() { second <- c.check(context.Background()) }()
		close(release)
		if err := <-first; err != nil {
			t.Fatal(err)
		}
		if err := <-second; err != nil {
			t.Fatal(err)
		}
		if got := reads.Load(); got != 1 {
			t.Fatalf("%d reads: the check waiting for the read in flight takes its pass", got)
		}
	})
}
