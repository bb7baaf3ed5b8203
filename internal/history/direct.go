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
	byKeyL := groupBy(leases, func(l Lease) string { return l.Key })
	for key, ls := range byKeyL {
		for _, l := range ls {
			if l.LastTrusted.IsZero() || l.Exempt {
				continue
			}
			var first *Takeover
			for i, t := range byKeyT[key] {
				if t.Holder != l.Holder && t.Fence > l.Fence && t.At.Before(l.LastTrusted) && (first == nil || t.At.Before(first.At)) {
					first = &byKeyT[key][i]
				}
			}
			if first != nil {
				problems = append(problems, fmt.Sprintf("%s: %s's fence %d was trusted at %s, %v after %s's claim of fence %d had committed",
					key, l.Holder, l.Fence, clock(l.LastTrusted), l.LastTrusted.Sub(first.At).Round(time.Microsecond), first.Holder, first.Fence))
				continue
			}
			var later *Lease
			for i, m := range ls {
				if m.Holder == l.Holder && m.Fence > l.Fence && !m.Returned.IsZero() && m.Returned.Before(l.LastTrusted) &&
					(later == nil || m.Returned.Before(later.Returned)) {
					later = &ls[i]
				}
			}
			if later != nil {
				problems = append(problems, fmt.Sprintf("%s: %s's fence %d was trusted at %s, %v after its own fence %d had been handed out",
					key, l.Holder, l.Fence, clock(l.LastTrusted), l.LastTrusted.Sub(later.Returned).Round(time.Microsecond), later.Fence))
			}
		}
	}
	sort.Strings(problems)
	return problems
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
