package pgleaseprom

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pglease"
)

// leaseID names one mandate: fences are unique per table, and holders per
// Locker.
type leaseID struct {
	holder, key string
	fence       int64
}

func idOf(e pglease.Event) leaseID { return leaseID{e.Holder, e.Key, e.Fence} }

// leaseSet keeps the leases-held gauge exact whatever the number of end
// events one lease produces. A Locker reports EventAcquired before anything
// else of a lease (see pglease.EventKind), then one end, except that a
// lease lost before or during its release reports EventLost and then
// EventReleaseFailed: only its first end counts.
type leaseSet struct {
	mu   sync.Mutex
	held map[leaseID]struct{}
}

func newLeaseSet() leaseSet {
	return leaseSet{held: make(map[leaseID]struct{})}
}

// acquired records a new lease and increments gauge.
func (s *leaseSet) acquired(id leaseID, gauge prometheus.Gauge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; !ok {
		s.held[id] = struct{}{}
		gauge.Inc()
	}
}

// ended records the end of a lease and decrements gauge the first time; a
// second end of the same lease changes nothing.
func (s *leaseSet) ended(id leaseID, gauge prometheus.Gauge) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; ok {
		delete(s.held, id)
		gauge.Dec()
	}
}
