package history

import (
	"fmt"
	"sort"
	"time"
)

// The checks below need what the model leaves out: the callers' own
// clocks. Every time is a time.Now() of the test process, taken so that the
// check stays sound: a lease's trust is timed before the call that found it
// trusted, a grant after the call that handed it out returned.

// Grant is a fence handed out for Key: a claim called at Call that returned
// Fence at Return.
type Grant struct {
	Key, Holder  string
	Fence        int64
	Call, Return time.Time
}

// FencesGrow checks that every fence handed out for a key is greater than
// every fence handed out for that key before the claim was called. It
// returns one line per violation.
func FencesGrow(grants []Grant) []string {
	var problems []string
	for key, gs := range groupBy(grants, func(g Grant) string { return g.Key }) {
		sort.Slice(gs, func(i, j int) bool { return gs[i].Return.Before(gs[j].Return) })
		// best[i] is the grant of the greatest fence among gs[:i+1].
		best := make([]int, len(gs))
		for i := range gs {
			best[i] = i
			if i > 0 && gs[best[i-1]].Fence > gs[i].Fence {
				best[i] = best[i-1]
			}
		}
		for _, g := range gs {
			// The grants that returned before g was called.
			n := sort.Search(len(gs), func(i int) bool { return !gs[i].Return.Before(g.Call) })
			if n == 0 {
				continue
			}
			if prev := gs[best[n-1]]; prev.Fence >= g.Fence {
				problems = append(problems, fmt.Sprintf("%s: %s got fence %d in a claim called %v after %s had got fence %d",
					key, g.Holder, g.Fence, g.Call.Sub(prev.Return).Round(time.Microsecond), prev.Holder, prev.Fence))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// Lease is one mandate handed to a caller, and the last time it was seen
// trusted (Err() == nil, timed before the call); LastTrusted is zero if it
// never was.
type Lease struct {
	Key, Holder string
	Fence       int64
	// Returned is when the claim that handed it out returned: the mandate
	// is believed from then on, and its holder's previous mandate of the
	// key must not be.
	Returned    time.Time
	LastTrusted time.Time
	// Exempt leases are not judged: an operator's ForceExpire let another
	// holder in while this one still believed, which is what it is
	// documented to do.
	Exempt bool
}

// Takeover is a row that a claim of Holder wrote with Fence, known
// committed by At (when its reply reached the claimant).
type Takeover struct {
	Key, Holder string
	Fence       int64
	At          time.Time
}

// Overlaps checks that no lease was trusted after a later mandate of its
// key took the row: after a claim of another holder with a greater fence
// had committed, or after its own holder's later lease of the key had been
// handed out. It returns one line per lease that overlaps.
func Overlaps(leases []Lease, takeovers []Takeover) []string {
	var problems []string
	byKeyT := groupBy(takeovers, func(t Takeover) string { return t.Key })
	for key, ls := range groupBy(leases, func(l Lease) string { return l.Key }) {
		ts := byKeyT[key]
		sort.Slice(ts, func(i, j int) bool { return ts[i].At.Before(ts[j].At) })
		top := topTwo(ts)
		later := laterOwn(ls)
		for _, l := range ls {
			if l.LastTrusted.IsZero() || l.Exempt {
				continue
			}
			// The takeovers committed before the lease was last trusted.
			n := sort.Search(len(ts), func(i int) bool { return !ts[i].At.Before(l.LastTrusted) })
			if n > 0 && top[n-1].above(l.Holder) > l.Fence {
				first := ts[0]
				for _, t := range ts[:n] {
					if t.Holder != l.Holder && t.Fence > l.Fence {
						first = t
						break
					}
				}
				problems = append(problems, fmt.Sprintf("%s: %s's fence %d was trusted at %s, %v after %s's claim of fence %d had committed",
					key, l.Holder, l.Fence, clock(l.LastTrusted), l.LastTrusted.Sub(first.At).Round(time.Microsecond), first.Holder, first.Fence))
				continue
			}
			if m, ok := later(l); ok {
				problems = append(problems, fmt.Sprintf("%s: %s's fence %d was trusted at %s, %v after its own fence %d had been handed out",
					key, l.Holder, l.Fence, clock(l.LastTrusted), l.LastTrusted.Sub(m.Returned).Round(time.Microsecond), m.Fence))
			}
		}
	}
	sort.Strings(problems)
	return problems
}

// best is the greatest fence among a prefix of takeovers, and the greatest
// of a holder other than its own.
type best struct {
	fence  int64
	holder string
	other  int64
}

// above is the greatest fence of a holder other than holder.
func (b best) above(holder string) int64 {
	if b.holder != holder {
		return b.fence
	}
	return b.other
}

// topTwo is best for each prefix ts[:i+1].
func topTwo(ts []Takeover) []best {
	out := make([]best, len(ts))
	var b best
	for i, t := range ts {
		switch {
		case t.Fence > b.fence && t.Holder == b.holder:
			b.fence = t.Fence
		case t.Fence > b.fence:
			b = best{fence: t.Fence, holder: t.Holder, other: b.fence}
		case t.Holder != b.holder && t.Fence > b.other:
			b.other = t.Fence
		}
		out[i] = b
	}
	return out
}

// laterOwn returns the function that finds, for a lease of ls, the first
// lease of its holder with a greater fence handed out before it was last
// trusted.
func laterOwn(ls []Lease) func(Lease) (Lease, bool) {
	byHolder := groupBy(ls, func(l Lease) string { return l.Holder })
	type prefix struct {
		leases []Lease // handed out, by time
		best   []int   // index of the greatest fence among leases[:i+1]
	}
	prefixes := map[string]prefix{}
	for h, hs := range byHolder {
		var p prefix
		for _, l := range hs {
			if !l.Returned.IsZero() {
				p.leases = append(p.leases, l)
			}
		}
		sort.Slice(p.leases, func(i, j int) bool { return p.leases[i].Returned.Before(p.leases[j].Returned) })
		p.best = make([]int, len(p.leases))
		for i := range p.leases {
			p.best[i] = i
			if i > 0 && p.leases[p.best[i-1]].Fence > p.leases[i].Fence {
				p.best[i] = p.best[i-1]
			}
		}
		prefixes[h] = p
	}
	return func(l Lease) (Lease, bool) {
		p := prefixes[l.Holder]
		n := sort.Search(len(p.leases), func(i int) bool { return !p.leases[i].Returned.Before(l.LastTrusted) })
		if n == 0 || p.leases[p.best[n-1]].Fence <= l.Fence {
			return Lease{}, false
		}
		for _, m := range p.leases[:n] {
			if m.Fence > l.Fence {
				return m, true
			}
		}
		return Lease{}, false
	}
}

// LedgerRow is a row a guarded transaction committed, numbered in commit
// order.
type LedgerRow struct {
	Seq   int64
	Key   string
	Fence int64
	Token string
}

// LedgerOrder checks that, per key and in commit order, the fences of the
// ledger's rows never go down: no write of an older mandate committed
// after a newer one's.
func LedgerOrder(rows []LedgerRow) []string {
	sorted := append([]LedgerRow(nil), rows...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Seq < sorted[j].Seq })
	last := map[string]LedgerRow{}
	var problems []string
	for _, r := range sorted {
		if prev, ok := last[r.Key]; ok && r.Fence < prev.Fence {
			problems = append(problems, fmt.Sprintf("%s: a write of fence %d (%s) committed after one of fence %d (%s)",
				r.Key, r.Fence, r.Token, prev.Fence, prev.Token))
			continue
		}
		last[r.Key] = r
	}
	return problems
}

// clock is t as a time of day, to the millisecond, to find it among a
// run's logs.
func clock(t time.Time) string { return t.Format("15:04:05.000") }

func groupBy[T any](xs []T, key func(T) string) map[string][]T {
	m := map[string][]T{}
	for _, x := range xs {
		m[key(x)] = append(m[key(x)], x)
	}
	return m
}

// Outage is a stretch of time in which no commit that waits for a
// synchronous standby could be confirmed: one had been seen waiting
// (From), and none was let go before Until.
type Outage struct{ From, Until time.Time }

// ConfirmedGrants checks that no lease was handed out by a claim called
// and returned within an outage: a claim that takes a row commits, and
// that commit could end its wait only by being cut short, unconfirmed. It
// returns one line per violation.
func ConfirmedGrants(grants []Grant, outages []Outage) []string {
	var problems []string
	for _, g := range grants {
		for _, o := range outages {
			if !g.Call.Before(o.From) && g.Return.Before(o.Until) {
				problems = append(problems, fmt.Sprintf("%s: %s got fence %d in a claim called %v into an outage of the synchronous standby and returned %v before its end",
					g.Key, g.Holder, g.Fence, g.Call.Sub(o.From).Round(time.Microsecond), o.Until.Sub(g.Return).Round(time.Microsecond)))
			}
		}
	}
	sort.Strings(problems)
	return problems
}
