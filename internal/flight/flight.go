// Package flight counts the calls on their way to a server, so that the
// one who closes can end them and wait for them.
//
// What Flights guarantees:
//
//   - Once Close has run, Enter refuses every call with Close's cause.
//   - Close ends the context of every call in flight with its cause; a call
//     that left before keeps its own context's cause.
//   - Wait returns nil only once Close has run and every call that entered
//     has left; when its context ends first, it says calls are still in
//     flight, and names them, with that context's cause.
package flight

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
)

// ErrInFlight is Wait's error when calls were still in flight as its
// context ended.
var ErrInFlight = errors.New("claims still in flight")

// Flights counts calls in flight. The zero value is ready to use.
type Flights struct {
	mu     sync.Mutex
	n      int
	names  map[string]int // the calls in flight by name
	closed error          // Close's cause; nil until Close
	stop   context.Context
	cancel context.CancelCauseFunc
	idle   chan struct{} // closed when n reaches 0 after Close
}

func (f *Flights) init() {
	if f.stop == nil {
		f.stop, f.cancel = context.WithCancelCause(context.Background())
		f.idle = make(chan struct{})
		f.names = make(map[string]int)
	}
}

// Enter counts a call in flight, named name, and returns its context: ctx,
// ended with Close's cause when Close runs. The call must run leave once
// done.
func (f *Flights) Enter(ctx context.Context, name string) (_ context.Context, leave func(), _ error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	if f.closed != nil {
		return nil, nil, f.closed
	}
	f.n++
	f.names[name]++
	cctx, cancel := context.WithCancelCause(ctx)
	stop := context.AfterFunc(f.stop, func() { cancel(context.Cause(f.stop)) })
	return cctx, func() {
		stop()
		cancel(context.Canceled)
		f.mu.Lock()
		defer f.mu.Unlock()
		if f.names[name]--; f.names[name] == 0 {
			delete(f.names, name)
		}
		if f.n--; f.n == 0 && f.closed != nil {
			close(f.idle)
		}
	}, nil
}

// Close refuses every later call with cause (not nil) and ends the
// contexts of those in flight with it. Later calls do nothing.
func (f *Flights) Close(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.init()
	if f.closed != nil {
		return
	}
	f.closed = cause
	f.cancel(cause)
	if f.n == 0 {
		close(f.idle)
	}
}

// Wait returns once Close has run and no call is in flight, or when ctx
// ends.
func (f *Flights) Wait(ctx context.Context) error {
	f.mu.Lock()
	f.init()
	idle := f.idle
	f.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return errors.Join(fmt.Errorf("%w: %s", ErrInFlight, f.inFlight()), context.Cause(ctx))
	}
}

// inFlight names the calls in flight: "a", "b" (2 calls).
func (f *Flights) inFlight() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	var names []string
	for name, n := range f.names {
		q := fmt.Sprintf("%q", name)
		if n > 1 {
			q += fmt.Sprintf(" (%d calls)", n)
		}
		names = append(names, q)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
