package pglease

import (
	"context"
	"fmt"
	"time"
)

// Between two attempts to release a row locked by another transaction, the
// wait starts at firstLockedRetry and doubles up to maxLockedRetry. Claims of
// other replicas that met the row while it changed hands lock it for their
// commit, which does not wait for a WAL flush (sqlstmt.Claim): well under a
// millisecond, so the first attempt again nearly always gets through. A long
// transaction (an operator's, a guarded job's) costs a few statements in
// its first quarter second, then four a second.
const (
	firstLockedRetry = time.Millisecond
	maxLockedRetry   = 250 * time.Millisecond
)

// releaseAll ends every lease with ended and expires their rows together,
// and reports each lease's outcome as release does. A lease whose release
// was already attempted (a concurrent Unlock) is left to it. It returns the
// outcome of each lease released here.
func (l *Locker) releaseAll(ctx context.Context, leases []*Lease, ended error) []error {
	batch := make([]releasing, 0, len(leases))
	for _, ls := range leases {
		if r, first := ls.startRelease(ended); first {
			batch = append(batch, r)
		}
	}
	if len(batch) == 0 {
		return nil
	}
	out := l.releaseRows(ctx, batch)
	errs := make([]error, len(batch))
	for i, r := range batch {
		errs[i] = l.finishRelease(r, releaseOutcome(r.prior, out[r.ls]))
	}
	return errs
}

// releaseRows sends the release statement for batch, and again for the rows it found
// locked by another transaction, waiting a little longer each time, until
// every row is released or lost or ctx ends. Each attempt waits for any
// heartbeat round in flight and keeps the next one out only for its own
// round trip: no attempt waits on a row lock. It returns the outcome of
// each lease: nil when released.
func (l *Locker) releaseRows(ctx context.Context, batch []releasing) map[*Lease]error {
	out := make(map[*Lease]error, len(batch))
	pending := make([]*Lease, len(batch))
	for i, r := range batch {
		pending[i] = r.ls
	}
	wait := firstLockedRetry
	for {
		got, err := l.releaseOnce(ctx, pending)
		if err != nil {
			for _, ls := range pending {
				out[ls] = err
			}
			return out
		}
		revoked := l.revokedOf(ctx, l.conns.release, pending, func(ls *Lease) bool { _, found := got[ls]; return !found })
		var locked []*Lease
		for _, ls := range pending {
			released, found := got[ls]
			switch {
			case !found:
				out[ls] = goneOnRelease(revoked[ls])
			case released:
				out[ls] = nil
			default:
				locked = append(locked, ls)
			}
		}
		if len(locked) == 0 {
			return out
		}
		pending = locked
		select {
		case <-ctx.Done():
			err := fmt.Errorf("row locked by another transaction until the release gave up (it lapses at its expiry): %w", context.Cause(ctx))
			for _, ls := range pending {
				out[ls] = err
			}
			return out
		case <-time.After(wait):
		}
		wait = min(2*wait, maxLockedRetry)
	}
}

// releaseOnce sends the release statement once no heartbeat round is in flight.
func (l *Locker) releaseOnce(ctx context.Context, leases []*Lease) (map[*Lease]bool, error) {
	if err := l.gate.EnterRelease(ctx); err != nil {
		return nil, fmt.Errorf("waiting for the heartbeat round in flight: %w", err)
	}
	defer l.gate.LeaveRelease()
	return l.proto.release(ctx, l.conns.release, leases)
}
