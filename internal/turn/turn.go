// Package turn lets one holder of a key at a time through, in the order
// they arrive at its turn, with keys independent of each other.
//
// What Turns guarantees:
//
//   - Of the callers of Take on one key, at most one holds its turn at a
//     time: the next is let in only once the previous one's done has been
//     called.
//   - Callers of different keys never wait for each other.
//   - A caller whose context ends while it waits gets its error and holds
//     nothing; nothing is remembered of a key once no caller holds or
//     waits for its turn.
//
// A Locker takes the turn of a key around each claim of it: two claims of
// one key by one Locker both succeed (the second is re-entrant), and only
// the one that committed last is the row's mandate. In turns, the last to
// commit is the last to register.
package turn

import (
	"context"
	"sync"
)

// Turns holds the turns of keys. The zero value is ready to use.
type Turns[K comparable] struct {
	mu    sync.Mutex
	turns map[K]*turn[K] // keys with a holder or a waiter
	free  []*turn[K]     // turns of keys forgotten, to be used again
}

// maxFree bounds the turns kept for reuse: a claim of a key takes a turn
// and gives it back, and reusing it spares a claim three allocations.
const maxFree = 64

type turn[K comparable] struct {
	key   K             // guarded by Turns.mu
	token chan struct{} // holds a value while a caller has the turn
	users int           // callers holding or waiting; guarded by Turns.mu
	done  func()        // what Take returns: made once per turn, not per call
}

// Take waits for key's turn, or for ctx to end (then it returns ctx.Err()).
// The caller calls done, once, when it is finished with the turn: done is
// the turn's own, shared with its other callers and, once the key is
// forgotten, with another key's, so a second call would end a turn not the
// caller's.
func (k *Turns[K]) Take(ctx context.Context, key K) (done func(), err error) {
	k.mu.Lock()
	if k.turns == nil {
		k.turns = make(map[K]*turn[K])
	}
	t := k.turns[key]
	if t == nil {
		t = k.newTurn()
		t.key = key
		k.turns[key] = t
	}
	t.users++
	k.mu.Unlock()

	select {
	case t.token <- struct{}{}:
		return t.done, nil
	case <-ctx.Done():
		k.leave(t)
		return nil, ctx.Err()
	}
}

// newTurn is a turn forgotten before, or a new one. Called with mu held.
func (k *Turns[K]) newTurn() *turn[K] {
	if n := len(k.free); n > 0 {
		t := k.free[n-1]
		k.free = k.free[:n-1]
		return t
	}
	t := &turn[K]{token: make(chan struct{}, 1)}
	t.done = func() {
		<-t.token
		k.leave(t)
	}
	return t
}

// leave forgets the key once no caller holds or waits for its turn.
func (k *Turns[K]) leave(t *turn[K]) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t.users--; t.users == 0 {
		delete(k.turns, t.key)
		var none K
		t.key = none
		if len(k.free) < maxFree {
			k.free = append(k.free, t)
		}
	}
}

// Len is how many keys have a holder or a waiter.
func (k *Turns[K]) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.turns)
}
