package pglease

import (
	"context"
	"sync"
)

// keyTurns lets one claim of a key at a time run in a Locker. Two claims of
// one key by one Locker both succeed (the second is re-entrant), and only
// the one that committed last is the row's mandate; with WithoutFenceColumn
// nothing tells which one that was. In turns, the last to commit is the
// last to register, so the lease a Locker holds is always the row's. Claims
// of different keys do not wait for each other.
type keyTurns struct {
	mu    sync.Mutex
	turns map[string]*keyTurn // keys with a claim running or waiting
}

type keyTurn struct {
	token chan struct{} // holds a value while a claim runs
	users int           // claims running or waiting; guarded by keyTurns.mu
}

// take waits for key's turn, or for ctx to end. The caller calls the
// returned function when its claim is registered or has failed.
func (k *keyTurns) take(ctx context.Context, key string) (done func(), err error) {
	k.mu.Lock()
	if k.turns == nil {
		k.turns = make(map[string]*keyTurn)
	}
	turn := k.turns[key]
	if turn == nil {
		turn = &keyTurn{token: make(chan struct{}, 1)}
		k.turns[key] = turn
	}
	turn.users++
	k.mu.Unlock()

	select {
	case turn.token <- struct{}{}:
		return func() {
			<-turn.token
			k.leave(key, turn)
		}, nil
	case <-ctx.Done():
		k.leave(key, turn)
		return nil, ctx.Err()
	}
}

// leave forgets the key once no claim runs or waits on it.
func (k *keyTurns) leave(key string, turn *keyTurn) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if turn.users--; turn.users == 0 {
		delete(k.turns, key)
	}
}
