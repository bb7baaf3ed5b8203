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
	turns map[K]*turn // keys with a holder or a waiter
}

type turn struct {
	token chan struct{} // holds a value while a caller has the turn
	users int           // callers holding or waiting; guarded by Turns.mu
}

// Take waits for key's turn, or for ctx to end (then it returns ctx.Err()).
// The caller calls done, once, when it is finished with the turn.
func (k *Turns[K]) Take(ctx context.Context, key K) (done func(), err error) {
	k.mu.Lock()
	if k.turns == nil {
		k.turns = make(map[K]*turn)
	}
	t := k.turns[key]
	if t == nil {
		t = &turn{token: make(chan struct{}, 1)}
		k.turns[key] = t
	}
	t.users++
	k.mu.Unlock()

	select {
	case t.token <- struct{}{}:
		return func() {
			<-t.token
			k.leave(key, t)
		}, nil
	case <-ctx.Done():
		k.leave(key, t)
		return nil, ctx.Err()
	}
}

// leave forgets the key once no caller holds or waits for its turn.
func (k *Turns[K]) leave(key K, t *turn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if t.users--; t.users == 0 {
		delete(k.turns, key)
	}
}

// Len is how many keys have a holder or a waiter.
func (k *Turns[K]) Len() int {
	k.mu.Lock()
	defer k.mu.Unlock()
	return len(k.turns)
}
