package turn

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestTurns(t *testing.T) {
	t.Parallel()

	t.Run("OneHolderOfAKeyAtATime", func(t *testing.T) {
		t.Parallel()
		for _, callers := range []int{2, 8, 64} {
			var (
				k          Turns[string]
				inside     atomic.Int32
				overlapped atomic.Bool
				wg         sync.WaitGroup
			)
			for range callers {
				wg.Add(1)
				go func() {
					defer wg.Done()
					done, err := k.Take(context.Background(), "k")
					if err != nil {
						t.Error(err)
						return
					}
					if inside.Add(1) > 1 {
						overlapped.Store(true)
					}
					time.Sleep(100 * time.Microsecond)
					inside.Add(-1)
					done()
				}()
			}
			wg.Wait()
			if overlapped.Load() {
				t.Fatalf("%d callers: two held the turn of one key at once", callers)
			}
			if n := k.Len(); n != 0 {
				t.Fatalf("%d callers: %d keys remembered after every turn ended", callers, n)
			}
		}
	})

	t.Run("KeysDoNotWaitForEachOther", func(t *testing.T) {
		t.Parallel()
		var k Turns[string]
		doneA, err := k.Take(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		defer doneA()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		doneB, err := k.Take(ctx, "b")
		if err != nil {
			t.Fatalf("the turn of b waited for a: %v", err)
		}
		doneB()
	})

	t.Run("TheNextWaitsForDone", func(t *testing.T) {
		t.Parallel()
		var k Turns[int]
		done, err := k.Take(context.Background(), 1)
		if err != nil {
			t.Fatal(err)
		}
		got := make(chan struct{})
		go func() {
			d, err := k.Take(context.Background(), 1)
			if err == nil {
				d()
			}
			close(got)
		}()
		select {
		case <-got:
			t.Fatal("the second caller got the turn while the first held it")
		case <-time.After(20 * time.Millisecond):
		}
		done()
		select {
		case <-got:
		case <-time.After(5 * time.Second):
			t.Fatal("the second caller never got the turn")
		}
	})

	t.Run("AWaiterWhoseContextEndsHoldsNothing", func(t *testing.T) {
		t.Parallel()
		cases := map[string]func() (context.Context, context.CancelFunc){
			"Cancelled": func() (context.Context, context.CancelFunc) {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx, cancel
			},
			"DeadlinePassed": func() (context.Context, context.CancelFunc) {
				return context.WithTimeout(context.Background(), 5*time.Millisecond)
			},
		}
		for name, mk := range cases {
			t.Run(name, func(t *testing.T) {
				var k Turns[string]
				done, err := k.Take(context.Background(), "k")
				if err != nil {
					t.Fatal(err)
				}
				ctx, cancel := mk()
				defer cancel()
				if _, err := k.Take(ctx, "k"); !errors.Is(err, ctx.Err()) || err == nil {
					t.Fatalf("Take returned %v, want the context's error", err)
				}
				done()
				if n := k.Len(); n != 0 {
					t.Fatalf("%d keys remembered after the waiter left and the holder was done", n)
				}
				done2, err := k.Take(context.Background(), "k")
				if err != nil {
					t.Fatalf("the turn was not free after the waiter left: %v", err)
				}
				done2()
			})
		}
	})

	t.Run("AReusedTurnServesItsNewKeyAlone", func(t *testing.T) {
		t.Parallel()
		var k Turns[string]
		doneA, err := k.Take(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		doneA() // a's turn is kept for reuse
		doneB, err := k.Take(context.Background(), "b")
		if err != nil {
			t.Fatal(err)
		}
		defer doneB()
		// a again: a turn of its own, free, though b holds the reused one.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		doneA2, err := k.Take(ctx, "a")
		if err != nil {
			t.Fatalf("a waited for b, which holds a's former turn: %v", err)
		}
		doneA2()
		// b's turn still held: a second taker of b waits.
		short, cancelShort := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancelShort()
		if _, err := k.Take(short, "b"); !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("a second holder of b was let in: %v", err)
		}
	})
}

// TestTurnAllocations runs alone: testing.AllocsPerRun counts the whole
// process's allocations.
func TestTurnAllocations(t *testing.T) {
	var k Turns[string]
	ctx := context.Background()
	allocs := testing.AllocsPerRun(100, func() {
		done, err := k.Take(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		done()
	})
	if allocs != 0 {
		t.Fatalf("%v allocations per turn taken and given back, want none once a turn is kept", allocs)
	}
}
