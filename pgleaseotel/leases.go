package pgleaseotel

import (
	"sync"
	"time"
)

// vacancies times the gap between an Elector's leadership ending and the
// next leadership of its key. The events of two Lockers of one process
// arrive in no set order: the next leader's EventElected may come before
// the end of the leadership it follows is reported, as a lease's end is
// reported after its release commits. Fences order them instead: a
// leadership stopped with fence f was handed over to the first one
// elected with a greater fence, at once if that one was reported first.
type vacancies struct {
	mu   sync.Mutex
	now  func() time.Time
	keys map[string]*vacancy
}

type vacancy struct {
	stopped     bool      // a leadership ended and no later one was seen
	stopFence   int64     // the fence of that leadership
	stopHolder  string    // its holder
	stopAt      time.Time // when its end was reported
	latestFence int64     // the greatest fence of a leadership seen to begin
}

func (v *vacancies) key(key string) *vacancy {
	if v.keys == nil {
		v.keys = make(map[string]*vacancy)
	}
	k, ok := v.keys[key]
	if !ok {
		k = &vacancy{}
		v.keys[key] = k
	}
	return k
}

// stop records the end of the leadership of key with fence. It returns
// the handover when a later leadership was reported already (a gap of
// zero: the key had its next leader before this end was reported).
func (v *vacancies) stop(key, holder string, fence int64) (gap time.Duration, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.key(key)
	if k.latestFence > fence {
		return 0, true
	}
	*k = vacancy{stopped: true, stopFence: fence, stopHolder: holder, stopAt: v.now(), latestFence: k.latestFence}
	return 0, false
}

// elected records a leadership of key with fence, and returns the
// handover it ends, if an earlier one's end was reported.
func (v *vacancies) elected(key string, fence int64) (gap time.Duration, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.key(key)
	k.latestFence = max(k.latestFence, fence)
	if !k.stopped || fence <= k.stopFence {
		return 0, false
	}
	k.stopped = false
	return v.now().Sub(k.stopAt), true
}

// newLeader records that an Elector saw holder lead key (another
// replica's leadership, whose fence its event does not carry), and returns
// the handover it ends: a holder other than the one that stopped leading
// is a later leadership.
func (v *vacancies) newLeader(key, holder string) (gap time.Duration, ok bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	k := v.key(key)
	if !k.stopped || holder == k.stopHolder {
		return 0, false
	}
	k.stopped = false
	return v.now().Sub(k.stopAt), true
}
