package pgleaseprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pglease"
)

// maxEarlyEnds bounds how many ends seen before their EventAcquired are
// remembered. An end comes first only when the heartbeat or Close ends a
// lease in the instant between its registration and the Acquired event, so
// the matching Acquired follows within microseconds; a few hundred is
// plenty, and old entries are dropped first.
const maxEarlyEnds = 512

// leaseID names one mandate: fences are unique per table, and holders per
// Locker.
type leaseID struct {
	holder, key string
	fence       int64
}

func idOf(e pglease.Event) leaseID { return leaseID{e.Holder, e.Key, e.Fence} }

// leaseSet keeps the leases-held gauge exact whatever the order and number
// of events one lease produces. A lease emits one EventAcquired and then
// one or more of EventLost, EventReleased and EventReleaseFailed: lost then
// unlocked gives Lost and ReleaseFailed. Only the first end counts. A lease
// can also end before its Acquired event is emitted, and a claim that Close
// overtook emits a release and then EventClaimFailed, never Acquired.
type leaseSet struct {
	mu    sync.Mutex
	held  map[leaseID]struct{}
	early map[leaseID]struct{} // ended before their Acquired was seen
	order []leaseID            // early, oldest first, for eviction
}

func newLeaseSet() leaseSet {
	return leaseSet{held: make(map[leaseID]struct{}), early: make(map[leaseID]struct{})}
}

// acquired records a new lease and increments gauge, unless the lease has
// already ended.
func (s *leaseSet) acquired(id leaseID, gauge prometheus.Gauge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.early[id]; ok {
		delete(s.early, id)
		return
	}
	if _, ok := s.held[id]; !ok {
		s.held[id] = struct{}{}
		gauge.Inc()
	}
}

// ended records the end of a lease and decrements gauge the first time.
func (s *leaseSet) ended(id leaseID, gauge prometheus.Gauge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; ok {
		delete(s.held, id)
		gauge.Dec()
		return
	}
	if _, ok := s.early[id]; ok {
		return
	}
	// Either a repeated end (Lost, then ReleaseFailed) or an end that came
	// before Acquired: remember it, boundedly, in case Acquired follows.
	if len(s.order) >= maxEarlyEnds {
		delete(s.early, s.order[0])
		s.order = s.order[1:]
	}
	s.early[id] = struct{}{}
	s.order = append(s.order, id)
}

// forget drops what is remembered of a lease that was never handed out.
func (s *leaseSet) forget(id leaseID) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.early, id)
}
