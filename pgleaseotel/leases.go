package pgleaseotel

import (
	"sync"
	"time"

	"github.com/pglease/pglease"
)

// leaseID names one mandate: fences are unique per table, and holders per
// Locker.
type leaseID struct {
	holder, key string
	fence       int64
}

func idOf(e pglease.Event) leaseID { return leaseID{e.Holder, e.Key, e.Fence} }

// leaseSet keeps the leases-held counter exact whatever the number of end
// events one lease produces. A Locker reports EventAcquired before anything
// else of a lease (see pglease.EventKind), then one end, except that a
// lease lost before or during its release reports EventLost and then
// EventReleaseFailed: only its first end counts.
type leaseSet struct {
	mu   sync.Mutex
	held map[leaseID]struct{}
}

// acquired records a new lease; it reports whether the lease was new.
func (s *leaseSet) acquired(id leaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; ok {
		return false
	}
	if s.held == nil {
		s.held = make(map[leaseID]struct{})
	}
	s.held[id] = struct{}{}
	return true
}

// ended records the end of a lease; it reports whether this was its first
// end. A second end of the same lease changes nothing.
func (s *leaseSet) ended(id leaseID) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.held[id]; !ok {
		return false
	}
	delete(s.held, id)
	return true
}

// vacancies times the gap between an Elector's leadership ending and the
// next leader of its key: one pending stop per key.
type vacancies struct {
	mu      sync.Mutex
	stopped map[string]time.Time
}

// stop records that the leadership of key ended at now.
func (v *vacancies) stop(key string, now time.Time) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.stopped == nil {
		v.stopped = make(map[string]time.Time)
	}
	v.stopped[key] = now
}

// filled records a leader of key seen at now, and returns how long the
// key had no leader since its last recorded stop; ok is false when no stop
// was pending.
func (v *vacancies) filled(key string, now time.Time) (gap time.Duration, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	at, ok := v.stopped[key]
	if !ok {
		return 0, false
	}
	delete(v.stopped, key)
	return now.Sub(at), true
}
