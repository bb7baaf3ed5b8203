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
//   - A call's notes (Note) are kept for Notes exactly when the call leaves
//     after Closing (or Close) ran: the one who closes hears what every call
//     that left from then on had to say. A call entered under another
//     (EnterUnder) that leaves before hands its notes to that one, if it
//     is still in flight; they are dropped only with a call that left
//     before Closing, and under none still in flight.
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
	calls  map[uint64]flying // by the number Enter gave each
	last   uint64            // the number of the latest call
	closed error             // Close's cause; nil until Close
	idle   chan struct{}     // closed when no call is in flight after Close
	// closing: Closing or Close has run; notes are the notes of the calls
	// that left since.
	closing bool
	notes   []error
}

// flying is what Flights keeps of a call in flight.
type flying struct {
	name   string
	cancel context.CancelCauseFunc
	notes  []error // Call.Note's
	parent uint64  // the call it was entered under (EnterUnder); 0: none
}

// Call is one call in flight: a value, so that entering allocates no
// more than the call's context.
type Call struct {
	f  *Flights
	id uint64
}

// Enter counts a call in flight, named name, and returns its context: ctx,
// ended with Close's cause when Close runs. The call must Leave once done.
func (f *Flights) Enter(ctx context.Context, name string) (context.Context, Call, error) {
	return f.EnterUnder(ctx, name, Call{})
}

// EnterUnder is Enter of a call made on behalf of parent, a call in
// flight (a waiting claim's attempt): what it notes and leaves with before
// Closing goes to parent.
func (f *Flights) EnterUnder(ctx context.Context, name string, parent Call) (context.Context, Call, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.closed != nil {
		return nil, Call{}, f.closed
	}
	if f.calls == nil {
		f.calls = make(map[uint64]flying)
	}
	cctx, cancel := context.WithCancelCause(ctx)
	f.last++
	f.calls[f.last] = flying{name: name, cancel: cancel, parent: parent.id}
	return cctx, Call{f: f, id: f.last}, nil
}

// Leave ends the call's context and stops counting it. Later calls do
// nothing.
func (c Call) Leave() {
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	fl, ok := f.calls[c.id]
	if !ok {
		return
	}
	fl.cancel(context.Canceled)
	delete(f.calls, c.id)
	if p, ok := f.calls[fl.parent]; !f.closing && ok {
		p.notes = append(p.notes, fl.notes...)
		f.calls[fl.parent] = p
	} else if f.closing {
		f.notes = append(f.notes, fl.notes...)
	}
	if len(f.calls) == 0 && f.closed != nil {
		close(f.idleLocked())
	}
}

// Note records err (nil: nothing) for the one who closes: it is kept for
// Notes if the call leaves once Closing has run.
func (c Call) Note(err error) {
	if err == nil {
		return
	}
	f := c.f
	f.mu.Lock()
	defer f.mu.Unlock()
	if fl, ok := f.calls[c.id]; ok {
		fl.notes = append(fl.notes, err)
		f.calls[c.id] = fl
	}
}

// Closing begins closing: the notes of every call that leaves from now on
// are kept for Notes. Close does it too, if it was not done before.
func (f *Flights) Closing() {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.closing = true
}

// Notes returns the notes of the calls that left since Closing.
func (f *Flights) Notes() []error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.notes)
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
	f.closed, f.closing = cause, true
	for _, c := range f.calls {
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
	for _, c := range f.calls {
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
