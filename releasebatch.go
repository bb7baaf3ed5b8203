package pglease

import (
	"context"
	"slices"
	"strings"
)

// releaseResult is what the statement that carried one release said of it.
type releaseResult struct {
	err   error // the release's outcome (releaseOutcome)
	alone bool  // the statement failed on an error of the server: send it again alone
}

// newReleases is the coalescer of a Locker's Unlocks: released together
// when they arrive while another release is in flight, with
// releaseAllSQL, as Close releases every lease.
func (l *Locker) newReleases() *coalescer[releasing, releaseResult] {
	return &coalescer[releasing, releaseResult]{send: l.sendReleases, limit: maxAloneInFlight}
}

// sendRelease expires r's row, alone or with the other releases of a
// burst, ordered after any heartbeat round in flight, and returns the
// outcome as releaseRow does.
func (l *Locker) sendRelease(ctx context.Context, r releasing) error {
	if l.releases == nil {
		return l.releaseRow(ctx, r)
	}
	o, _, err := l.releases.do(ctx, r)
	switch {
	case err != nil:
		// Sent or not, the lease has ended; at worst its row lapses at its
		// expiry.
		return releaseOutcome(r.prior, err, false)
	case o.alone:
		return l.releaseRow(ctx, r)
	}
	return o.err
}

// sendReleases is the coalescer's statement: releaseSQL for a release alone,
// releaseAllSQL (through releaseRows, behind the same gate) for a burst.
// The burst's rows are sent in key order, the order in which a burst of
// claims locks them (claimAllSQL), so that the two do not deadlock; should
// the statement fail on an error one row may cause (rowError), each
// release goes again alone.
func (l *Locker) sendReleases(ctx context.Context, batch []releasing) []releaseResult {
	out := make([]releaseResult, len(batch))
	if len(batch) == 1 && !coalesceAll {
		out[0].err = l.releaseRow(ctx, batch[0])
		return out
	}
	// Two leases of one key (one lost to a re-entrant claim) differ by
	// their fence, but releaseAll reports by key: the second goes alone.
	first := make(map[string]*Lease, len(batch))
	var rows []releasing
	for _, r := range batch {
		if first[r.ls.key] == nil {
			first[r.ls.key] = r.ls
			rows = append(rows, r)
		}
	}
	slices.SortFunc(rows, func(a, b releasing) int { return strings.Compare(a.ls.key, b.ls.key) })
	released, err := l.releaseRows(ctx, rows)
	for i, r := range batch {
		if first[r.ls.key] != r.ls || err != nil && rowError(err) {
			out[i].alone = true
			continue
		}
		out[i].err = releaseOutcome(r.prior, err, released[r.ls])
	}
	return out
}
