// Package leaseset keeps a count of the leases a Locker holds exact from its
// hook's events, for the metrics modules (pgleaseprom, pgleaseotel): a
// Locker reports EventAcquired before anything else of a lease, then one
// end, except that a lease lost before or during its release reports
// EventLost and then EventReleaseFailed. Only a lease's first end counts.
package leaseset

import (
	"sync"

	"github.com/pglease/pglease"
)

// ID names one lease: fences are unique per table, and holders per Locker.
type ID struct {
	Holder, Key string
	Fence       int64
}

// Of is the lease an event is about.
func Of(e pglease.Event) ID { return ID{e.Holder, e.Key, e.Fence} }

// Set is the leases acquired and not yet ended. Its zero value is empty and
// ready; it is safe for concurrent use.
type Set struct {
	mu   sync.Mutex
	held map[ID]struct{}
}

// Acquired records a new lease and reports whether it was new: count it
// then.
func (s *Set) Acquired(id ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; ok {
		return false
	}
	if s.held == nil {
		s.held = make(map[ID]struct{})
	}
	s.held[id] = struct{}{}
	return true
}

// Ended records the end of a lease and reports whether it was its first
// end of a lease acquired: uncount it then. Any other end changes nothing.
func (s *Set) Ended(id ID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; !ok {
		return false
	}
	delete(s.held, id)
	return true
}
