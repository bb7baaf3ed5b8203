// Package fence remembers, per key, the greatest fence handed out, for as
// long as asked.
//
// A Locker remembers the fences its own claims were handed for as long as
// a row of that fence may stay live after its lease ended (a release keeps
// a row for its min hold). A claim whose outcome is unknown gives back a
// live row of its holder only if the row's fence is greater: a fence it
// remembers is a lease it handed out, released or not, whose row must be
// left as that release made it.
//
// What Known guarantees:
//
//   - Greatest never reports less than the greatest fence seen for a key
//     whose keep has not passed, and never an older fence than that: a
//     smaller fence seen later never lowers it, a shorter keep never cuts
//     a longer one.
//   - Once the map has doubled since its last sweep (and is at least
//     MinSweep entries), entries whose keep has passed are swept, so that
//     claims of ever new keys keep only the entries still in force.
package fence

import "time"

// MinSweep is the size below which Known never sweeps.
const MinSweep = 64

// Known remembers the greatest fence per key. The zero value is ready to
// use. It is not safe for concurrent use: its owner (a Locker's registry)
// calls it under its own lock, with the leases it keeps beside it.
type Known[K comparable] struct {
	m       map[K]entry
	sweepAt int
}

type entry struct {
	fence int64
	until time.Time // a time.Now() value: past it, the entry is forgotten
}

// See records that fence of key was handed out at now, and is to be
// remembered for keep.
func (k *Known[K]) See(key K, fence int64, now time.Time, keep time.Duration) {
	if k.m == nil {
		k.m = make(map[K]entry)
	}
	until := now.Add(keep)
	if old, ok := k.m[key]; ok {
		fence = max(fence, old.fence)
		if old.until.After(until) {
			until = old.until
		}
	}
	k.m[key] = entry{fence: fence, until: until}
	if len(k.m) >= max(k.sweepAt, MinSweep) {
		for key, e := range k.m {
			if !now.Before(e.until) {
				delete(k.m, key)
			}
		}
		k.sweepAt = 2 * len(k.m)
	}
}

// Greatest is the greatest fence of key still remembered at now; 0 if none.
func (k *Known[K]) Greatest(key K, now time.Time) int64 {
	e, ok := k.m[key]
	if !ok || !now.Before(e.until) {
		return 0
	}
	return e.fence
}

// Len is how many entries are remembered, swept or not.
func (k *Known[K]) Len() int {
	return len(k.m)
}
