package pglease

import (
	"context"
	"errors"
	"sync"
)

// flights counts the calls of a Locker on their way to the server (claims,
// waiting claims), so that Close can end them and wait for them: no claim
// may commit, or give back what it committed, after Close returned.
type flights struct {
	mu     sync.Mutex
	n      int
	closed bool
	stop   context.Context // ended by close
	cancel context.CancelFunc
	idle   chan struct{} // closed when n reaches 0 after close
}

func (f *flights) init() {
	if f.stop == nil {
		f.stop, f.cancel = context.WithCancel(context.Background())
		f.idle = make(chan struct{})
	}
}

// enter counts a call in flight and returns its context: ctx, ended with
// cause ErrClosed when close runs. The call must run leave once done.
func (f *flights) enter(ctx context.Context) (context.Context, func(), error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	if f.closed {
		return nil, nil, ErrClosed
	}
	f.n++
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(f.stop, func() { cancel(ErrClosed) })
	return cctx, func() {
		stop()
		cancel(context.Canceled)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.n--; f.n == 0 && f.closed {
			close(f.idle)
		}
	}, nil
}

// close refuses every later call and ends the contexts of those in flight.
func (f *flights) close() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	if f.closed {
		return
	}
	f.closed = true
	f.cancel()
	if f.n == 0 {
		close(f.idle)
	}
}

// errInFlight is wait's error when calls were still in flight as ctx ended.
var errInFlight = errors.New("claims still in flight")

// wait returns once close has run and no call is in flight, or when ctx
// ends.
func (f *flights) wait(ctx context.Context) error {
	f.mu.Lock()
	f.init()
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return errors.Join(errInFlight, context.Cause(ctx))
	}
}
