// Package waiters is the waiting claims of a Locker, grouped by key.
//
// What a Set guarantees:
//
//   - The waiters of one key form one Group; one of them at a time holds
//     its turn (Take, Give), claims and sleeps, so that a release wakes
//     one claim statement per Locker, not one per waiter.
//   - Wake wakes the sleeper of a key's group, if any; a wake that comes
//     while nobody sleeps is kept for the next sleep, until Fresh drops
//     it at the start of an attempt, which sees any release before it.
//   - RepollAll shortens every group's sleep to the polling pause its
//     schedule gives (poll.Schedule.Repoll): notifications stopped.
//   - Close ends every turn waited for and every sleep, and refuses every
//     later Join, with ErrClosed.
package waiters

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/poll"
)

// ErrClosed is Join's and Take's error once the Set is closed.
var ErrClosed = errors.New("waiting ended by Close")

// Set is the waiting claims of one Locker. Its zero value is ready.
type Set struct {
	mu      sync.Mutex
	groups  map[string]*Group // keys with a waiter
	stopped chan struct{}     // closed by Close
	closed  bool
}

// Group is the waiters of one key in one Set.
type Group struct {
	turn    chan struct{} // holds a value while a waiter claims for the group
	wake    chan struct{} // a release since the last Fresh
	repoll  chan struct{} // notifications stopped since the last Fresh
	stopped <-chan struct{}
	users   int // guarded by Set.mu
}

func (s *Set) stopCh() chan struct{} {
	if s.stopped == nil {
		s.stopped = make(chan struct{})
	}
	return s.stopped
}

// Join adds a waiter of key and returns the key's group; ErrClosed once
// the Set is closed. Each Join is followed by one Leave.
func (s *Set) Join(key string) (*Group, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		return nil, ErrClosed
	}
	if s.groups == nil {
		s.groups = make(map[string]*Group)
	}
	g := s.groups[key]
	if g == nil {
		g = &Group{turn: make(chan struct{}, 1), wake: make(chan struct{}, 1), repoll: make(chan struct{}, 1), stopped: s.stopCh()}
		s.groups[key] = g
	}
	g.users++
	return g, nil
}

// Leave removes a waiter of key that Join added.
func (s *Set) Leave(key string, g *Group) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(s.groups, key)
	}
}

// Waiters is the number of waiters of key.
func (s *Set) Waiters(key string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if g := s.groups[key]; g != nil {
		return g.users
	}
	return 0
}

// Wake wakes the waiters of key, if any.
func (s *Set) Wake(key string) {
	s.mu.Lock()
	g := s.groups[key]
	s.mu.Unlock()
	if g != nil {
		Signal(g.wake)
	}
}

// RepollAll tells every group that notifications stopped.
func (s *Set) RepollAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, g := range s.groups {
		Signal(g.repoll)
	}
}

// Close ends every wait with ErrClosed; it is idempotent.
func (s *Set) Close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.closed {
		s.closed = true
		close(s.stopCh())
	}
}

// Take waits for the group's turn, until ctx ends (its error) or the Set
// closes (ErrClosed). Give hands the turn back.
func (g *Group) Take(ctx context.Context) error {
	select {
	case g.turn <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-g.stopped:
		return ErrClosed
	}
}

// Give hands back the turn Take took.
func (g *Group) Give() { <-g.turn }

// Fresh drops the wakes and repolls kept so far: an attempt begins, and
// sees every release before it.
func (g *Group) Fresh() {
	Drain(g.wake)
	Drain(g.repoll)
}

// Pause is one sleep of a waiting claim.
type Pause struct {
	For  time.Duration
	Own  <-chan struct{} // the end of the Locker's own lease on the key; nil if none
	Kick <-chan struct{} // try again at once; nil if none
	// Schedule, when not nil, gave For at Read: the switch to polling
	// shortens the sleep to the polling pause it gives from Read.
	Schedule *poll.Schedule
	Read     time.Time
}

// Sleep sleeps p.For, or until a wake, p.Own, p.Kick, ctx's end (its
// error) or the Set's Close (ErrClosed) comes first.
func (g *Group) Sleep(ctx context.Context, p Pause) error {
	timer := time.NewTimer(p.For)
	defer timer.Stop()
	var repoll <-chan struct{}
	if p.Schedule != nil {
		repoll = g.repoll
	}
	for {
		select {
		case <-g.wake:
		case <-p.Own:
		case <-p.Kick:
		case <-timer.C:
		case <-repoll:
			if d, ok := p.Schedule.Repoll(); ok {
				timer.Reset(time.Until(p.Read.Add(d)))
			}
			continue
		case <-ctx.Done():
			return ctx.Err()
		case <-g.stopped:
			return ErrClosed
		}
		return nil
	}
}

// Signal sends on ch without blocking: a signal already pending stands for
// both.
func Signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

// Drain drops a pending signal of ch, if any.
func Drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
}
