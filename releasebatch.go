package pglease

import (
	"context"
	"fmt"

	"github.com/pglease/pglease/internal/coalesce"
)

// releaseResult is what the statement that carried one release said of it.
type releaseResult struct {
	err   error // the release's outcome (releaseOutcome)
	alone bool  // not settled by that statement: send it again alone
}

// newReleases is the coalescer of a Locker's Unlocks: released together
// when they arrive while other releases are in flight, in one release
// statement, as Close releases every lease.
func (l *Locker) newReleases() *coalesce.Coalescer[releasing, releaseResult] {
	return &coalesce.Coalescer[releasing, releaseResult]{Send: l.sendReleases, Limit: maxAloneInFlight}
}

// sendRelease expires r's row, alone or with the other releases of a
// burst, ordered after any heartbeat round in flight, and returns the
// outcome as releaseRows does.
func (l *Locker) sendRelease(ctx context.Context, r releasing) error {
	if l.releases == nil {
		return l.releaseAlone(ctx, r)
	}
	o, _, err := l.releases.Do(ctx, r)
	switch {
	case err != nil:
		// Sent or not, the lease has ended; at worst its row lapses at its
		// expiry.
		return releaseOutcome(r.prior, fmt.Errorf("waiting for the release statement in flight: %w", err))
	case o.alone:
		return l.releaseAlone(ctx, r)
	}
	return o.err
}

// releaseAlone releases r on its own, sent again while its row is locked.
func (l *Locker) releaseAlone(ctx context.Context, r releasing) error {
	return releaseOutcome(r.prior, l.releaseRows(ctx, []releasing{r})[r.ls])
}

// sendReleases is the coalescer's statement: the release statement once
// for every release of batch (releaseOnce), one or many. The releases it
// could not settle go again one by one, outside the coalescer, as an Unlock
// alone always did (releaseRows): a row locked by another transaction
// (skipped, and sent again until released), a second lease of a key already
// in the burst (a lease lost to a re-entrant claim: the statement reports
// by key), or a statement that failed on an error one row may cause
// (rowError). A row locked elsewhere thus never holds up the others'
// outcomes, nor a place in flight. The release statement never waits on a
// row lock, so a burst of releases cannot deadlock with a burst of claims.
func (l *Locker) sendReleases(ctx context.Context, batch []releasing) []releaseResult {
	out := make([]releaseResult, len(batch))
	first := make(map[string]*Lease, len(batch))
	var leases []*Lease
	for _, r := range batch {
		if first[r.ls.key] == nil {
			first[r.ls.key] = r.ls
			leases = append(leases, r.ls)
		}
	}
	got, err := l.releaseOnce(ctx, leases)
	var revoked map[*Lease]bool
	if err == nil {
		revoked = l.revokedOf(ctx, l.conns.release, leases, func(ls *Lease) bool { _, found := got[ls]; return !found })
	}
	for i, r := range batch {
		released, found := got[r.ls]
		switch {
		case first[r.ls.key] != r.ls, err != nil && rowError(ctx, err), err == nil && found && !released:
			out[i].alone = true
		case err != nil:
			out[i].err = releaseOutcome(r.prior, err)
		case !found:
			out[i].err = releaseOutcome(r.prior, goneOnRelease(revoked[r.ls]))
		default:
			out[i].err = releaseOutcome(r.prior, nil)
		}
	}
	return out
}
