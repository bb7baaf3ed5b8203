package pgtest

import (
	"sync"
	"testing"
	"time"

	"github.com/pglease/pglease"
)

// maxEvents bounds what an Events keeps. A test that produces more has a
// runaway Locker: the test fails rather than lose events silently.
const maxEvents = 100_000

// Events records a Locker's events (give Hook to WithHook) for assertions.
// It keeps every event in order; each WaitFor looks from just after the
// event the previous WaitFor returned, so no event that arrives between two
// waits is missed, and none is counted twice.
type Events struct {
	t        testing.TB
	mu       sync.Mutex
	events   []pglease.Event
	cursor   int           // where the next WaitFor starts looking
	arrived  chan struct{} // closed and replaced when an event arrives
	overflow bool
}

// NewEvents returns an empty recorder; the test fails at its end if more
// than maxEvents arrived.
func NewEvents(tb testing.TB) *Events {
	tb.Helper()
	e := &Events{t: tb, arrived: make(chan struct{})}
	tb.Cleanup(func() {
		if e.overflowed() {
			tb.Errorf("pgtest: more than %d events: the recorder refused the rest", maxEvents)
		}
	})
	return e
}

// Hook records ev; pass it to pglease.WithHook.
func (e *Events) Hook(ev pglease.Event) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if len(e.events) >= maxEvents {
		e.overflow = true
		return
	}
	e.events = append(e.events, ev)
	close(e.arrived)
	e.arrived = make(chan struct{})
}

func (e *Events) overflowed() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.overflow
}

// All returns a copy of every event so far, in order.
func (e *Events) All() []pglease.Event {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.overflow {
		e.t.Errorf("pgtest: more than %d events: the recorder refused the rest", maxEvents)
	}
	return append([]pglease.Event(nil), e.events...)
}

// Count returns how many events of kind arrived so far.
func (e *Events) Count(kind pglease.EventKind) int {
	n := 0
	for _, ev := range e.All() {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// WaitFor returns the first event of kind after the one the previous
// WaitFor returned, waiting for it up to limit, and fails the test if none
// arrives.
func (e *Events) WaitFor(tb testing.TB, kind pglease.EventKind, limit time.Duration) pglease.Event {
	tb.Helper()
	deadline := time.NewTimer(limit)
	defer deadline.Stop()
	for {
		e.mu.Lock()
		for i := e.cursor; i < len(e.events); i++ {
			if e.events[i].Kind == kind {
				e.cursor = i + 1
				ev := e.events[i]
				e.mu.Unlock()
				return ev
			}
		}
		overflow, arrived := e.overflow, e.arrived
		e.mu.Unlock()
		if overflow {
			tb.Fatalf("pgtest: more than %d events: the recorder refused the rest", maxEvents)
		}
		select {
		case <-arrived:
		case <-deadline.C:
			tb.Fatalf("no %v event within %v", kind, limit)
		}
	}
}
