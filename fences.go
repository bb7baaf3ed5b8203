package pglease

import (
	"sync"
	"time"
)

// minPrune is the size below which knownFences never sweeps.
const minPrune = 64

// knownFences remembers, per key, the greatest fence a Locker was handed by
// a claim of its own, for as long as a row of that fence may stay live
// after its lease ended (a release keeps a row for its min hold). A claim
// whose outcome is unknown gives back a live row of its holder only if the
// row's fence is greater: a fence it remembers is a lease it handed out,
// released or not, whose row must be left as that release made it.
//
// Entries are swept once the map has doubled since the last sweep, so that
// a Locker claiming ever new keys keeps only the entries still in force.
type knownFences struct {
	mu      sync.Mutex
	m       map[string]knownFence
	sweepAt int
}

type knownFence struct {
	fence int64
	until time.Time // a time.Now() value: past it, the entry is forgotten
}

// see records that fence of key was handed out at now, and is to be
// remembered for keep.
func (k *knownFences) see(key string, fence int64, now time.Time, keep time.Duration) {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.m == nil {
		k.m = make(map[string]knownFence)
	}
	until := now.Add(keep)
	if old, ok := k.m[key]; ok {
		fence, until = max(fence, old.fence), latest(until, old.until)
	}
	k.m[key] = knownFence{fence: fence, until: until}
	if len(k.m) >= max(k.sweepAt, minPrune) {
		for key, e := range k.m {
			if !now.Before(e.until) {
				delete(k.m, key)
			}
		}
		k.sweepAt = 2 * len(k.m)
	}
}

// greatest is the greatest fence of key still remembered at now; 0 if none.
func (k *knownFences) greatest(key string, now time.Time) int64 {
	k.mu.Lock()
	defer k.mu.Unlock()
	e, ok := k.m[key]
	if !ok || !now.Before(e.until) {
		return 0
	}
	return e.fence
}

func latest(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}
