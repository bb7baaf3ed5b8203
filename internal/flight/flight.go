// Package flight counts the calls on their way to a server, so that the
// one who closes can end them and wait for them.
//
// What Flights guarantees:
//
//   - Once Close has run, Enter refuses every call with Close's cause.
//   - Close ends, before it returns, the context of every call in flight
//     with its cause; a call that left before keeps its own context's cause.
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
	calls  map[*Call]struct{}
	closed error         // Close's cause; nil until Close
	idle   chan struct{} // closed when no call is in flight after Close
}

// Call is one call in flight.
type Call struct {
	f      *Flights
	name   string
	cancel context.CancelCauseFunc
}

// Enter counts a call in flight, named name, and returns its context: ctx,
// ended with Close's cause when Close runs. The call must Leave once done.
func (f *Flights) Enter(ctx context.Context, name string) (context.Context, *Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed != nil {
		return nil, nil, f.closed
	}
	if f.calls == nil {
		f.calls = make(map[*Call]struct{})
	}
	cctx, cancel := context.WithCancelCause(ctx)
	c := &Call{f: f, name: name, cancel: cancel}
	f.calls[c] = struct{}{}
	return cctx, c, nil
}

// Leave ends the call's context and stops counting it. Later calls do
// nothing.
func (c *Call) Leave() {
	c.cancel(context.Canceled)
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.calls[c]; !ok {
		return
	}
	delete(f.calls, c)
	if len(f.calls) == 0 && f.closed != nil {
		close(f.idleLocked())
	}
}

// idleLocked is the channel closed once no call is in flight after Close.
func (f *Flights) idleLocked() chan struct{} {
	if f.idle == nil {
		f.idle = make(chan struct{})
	}
	return f.idle
}

// Close refuses every later call with cause (not nil) and ends the
// contexts of those in flight with it. Later calls do nothing.
func (f *Flights) Close(cause error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed != nil {
		return
	}
	f.closed = cause
	for c := range f.calls {
		c.cancel(cause) // never blocks: the context's AfterFuncs run on their own
	}
	if len(f.calls) == 0 {
		close(f.idleLocked())
	}
}

// Wait returns once Close has run and no call is in flight, or when ctx
// ends.
func (f *Flights) Wait(ctx context.Context) error {
	f.mu.Lock()
	idle := f.idleLocked()
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
	counts := map[string]int{}
	for c := range f.calls {
		counts[c.name]++
	}
	var names []string
	for name, n := range counts {
		q := fmt.Sprintf("%q", name)
		if n > 1 {
			q += fmt.Sprintf(" (%d calls)", n)
		}
		names = append(names, q)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
