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

// TestTurnsReusedUnderChurn attacks the reuse of forgotten turns: many
// more keys than maxFree, holders and waiters whose contexts end at random
// (some while the turn they wait on is handed around), so that turn structs
// go through the free list and back to other keys constantly. Each key must
// have at most one holder at a time; a key held for long must never hold
// up the others; nothing is remembered at the end.
func TestTurnsReusedUnderChurn(t *testing.T) {
	t.Parallel()
	const (
		keys    = 3 * maxFree
		workers = 48
		rounds  = 400
	)
	var (
		k      Turns[int]
		inside [keys]atomic.Int32
		wg     sync.WaitGroup
		stop   = make(chan struct{})
	)
	// A slow key, held for long stretches: churn on others must not wait.
	const slow = keys
	doneSlow, err := k.Take(context.Background(), slow)
	if err != nil {
		t.Fatal(err)
	}
	for w := range workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range rounds {
				key := (w*7 + i*13) % keys
				if i%5 == 0 {
					key = (w + i) % 4 // a few hot keys, with waiters queued
				}
				var (
					ctx    context.Context
					cancel context.CancelFunc
				)
				switch i % 3 {
				case 0:
					ctx, cancel = context.WithTimeout(context.Background(), time.Duration(i%4)*50*time.Microsecond)
				default:
					ctx, cancel = context.WithTimeout(context.Background(), 5*time.Second)
				}
				done, err := k.Take(ctx, key)
				cancel()
				if err != nil {
					if i%3 != 0 {
						t.Errorf("key %d: a waiter with 5s gave up: %v", key, err)
					}
					continue
				}
				if n := inside[key].Add(1); n != 1 {
					t.Errorf("key %d: %d holders at once", key, n)
				}
				if i%7 == 0 {
					time.Sleep(20 * time.Microsecond)
				}
				inside[key].Add(-1)
				done()
			}
		}()
	}
	// Meanwhile, the slow key's holder is busy; a taker of a fresh key
	// always gets in at once.
	probeDone := make(chan struct{})
	go func() {
		defer close(probeDone)
		for i := 0; ; i++ {
			select {
			case <-stop:
				return
			default:
			}
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			d, err := k.Take(ctx, keys+1+i%maxFree)
			cancel()
			if err != nil {
				t.Errorf("a free key waited: %v", err)
				return
			}
			d()
		}
	}()
	wg.Wait()
	close(stop)
	<-probeDone
	// The slow key's turn is still its own: a second taker waits.
	short, cancelShort := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancelShort()
	if _, err := k.Take(short, slow); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second holder of the slow key was let in: %v", err)
	}
	doneSlow()
	if n := k.Len(); n != 0 {
		t.Fatalf("%d keys remembered after every turn ended", n)
	}
	k.mu.Lock()
	free := len(k.free)
	for _, tr := range k.free {
		if tr.users != 0 || len(tr.token) != 0 || tr.key != 0 {
			t.Errorf("a free turn is in use: users %d, token %d, key %d", tr.users, len(tr.token), tr.key)
		}
	}
	k.mu.Unlock()
	if free > maxFree {
		t.Fatalf("%d turns kept, more than %d", free, maxFree)
	}
	// Every key is free again.
	for key := range keys + 1 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		d, err := k.Take(ctx, key)
		cancel()
		if err != nil {
			t.Fatalf("key %d not free after the churn: %v", key, err)
		}
		d()
	}
}

// TestTurnsWaiterLeavesWhileTurnChangesHands: a waiter of a whose context
// ends just as a's holder is done must leave a's turn consistent, and a's
// turn, once forgotten and reused for b, must not let anybody of a in
// alongside b's holder, or hold b's holder up.
func TestTurnsWaiterLeavesWhileTurnChangesHands(t *testing.T) {
	t.Parallel()
	for i := range 500 {
		var k Turns[string]
		doneA, err := k.Take(context.Background(), "a")
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		got := make(chan func(), 1)
		go func() {
			d, err := k.Take(ctx, "a")
			if err != nil {
				d = nil
			}
			got <- d
		}()
		if i%2 == 0 {
			time.Sleep(time.Duration(i%5) * time.Microsecond)
		}
		go cancel()
		doneA()
		d := <-got
		if d != nil {
			// The waiter got a's turn: b must not share it.
			doneB, err := k.Take(context.Background(), "b")
			if err != nil {
				t.Fatal(err)
			}
			short, c2 := context.WithTimeout(context.Background(), time.Millisecond)
			if _, err := k.Take(short, "a"); err == nil {
				t.Fatalf("round %d: two holders of a", i)
			}
			c2()
			doneB()
			d()
		}
		// a is forgotten: its turn goes to b, and a again gets one apart.
		doneB, err := k.Take(context.Background(), "b")
		if err != nil {
			t.Fatal(err)
		}
		ctx2, c3 := context.WithTimeout(context.Background(), time.Second)
		doneA2, err := k.Take(ctx2, "a")
		c3()
		if err != nil {
			t.Fatalf("round %d: a waited for b: %v", i, err)
		}
		short, c4 := context.WithTimeout(context.Background(), time.Millisecond)
		if _, err := k.Take(short, "b"); err == nil {
			t.Fatalf("round %d: two holders of b", i)
		}
		c4()
		doneA2()
		doneB()
		if n := k.Len(); n != 0 {
			t.Fatalf("round %d: %d keys remembered", i, n)
		}
		cancel()
	}
}
