package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// maxLockedRetry is the longest wait between two attempts to release a row
// locked by another transaction.
const maxLockedRetry = 250 * time.Millisecond

func (p *fenced) release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	keys := make([]string, len(leases))
	fences := make([]int64, len(leases))
	byKey := make(map[string]*Lease, len(leases))
	for i, ls := range leases {
		keys[i], fences[i], byKey[ls.key] = ls.key, ls.fence, ls
	}
	minHolds := seconds(leases, func(t terms) time.Duration { return t.minHold })
	rows, err := db.Query(ctx, p.releaseSQL, p.holder, minHolds, keys, fences)
	if err != nil {
		return nil, err
	}
	return scanReleased(rows, func(key string, fence int64, _ string) *Lease {
		if ls := byKey[key]; ls != nil && ls.fence == fence {
			return ls
		}
		return nil
	})
}

func (p *unfenced) release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	keys := make([]string, len(leases))
	holders := make([]string, len(leases))
	acquired := make([]time.Time, len(leases))
	byKey := make(map[string]*Lease, len(leases))
	for i, ls := range leases {
		keys[i], holders[i], acquired[i], byKey[ls.key] = ls.key, ls.holder, ls.acquiredAt, ls
	}
	minHolds := seconds(leases, func(t terms) time.Duration { return t.minHold })
	rows, err := db.Query(ctx, p.relSQL, minHolds, keys, holders, acquired)
	if err != nil {
		return nil, err
	}
	return scanReleased(rows, func(key string, _ int64, holder string) *Lease {
		if ls := byKey[key]; ls != nil && ls.holder == holder {
			return ls
		}
		return nil
	})
}

// scanReleased reads the answer of a release statement: per row, a lease's
// key, its fence (fenced) or forged holder (unfenced), and whether it was
// released (false: locked by another transaction). match finds the lease a
// row is about.
func scanReleased(rows pgx.Rows, match func(key string, fence int64, holder string) *Lease) (map[*Lease]bool, error) {
	defer rows.Close()
	got := make(map[*Lease]bool)
	for rows.Next() {
		var (
			key      string
			mandate  any // the fence or the forged holder
			released bool
		)
		if err := rows.Scan(&key, &mandate, &released); err != nil {
			return nil, err
		}
		fence, _ := mandate.(int64)
		holder, _ := mandate.(string)
		if ls := match(key, fence, holder); ls != nil {
			got[ls] = released
		}
	}
	return got, rows.Err()
}

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

// releaseRows sends releaseSQL for batch, and again for the rows it found
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
	wait := minRetry
	for {
		got, err := l.releaseOnce(ctx, pending)
		if err != nil {
			for _, ls := range pending {
				out[ls] = err
			}
			return out
		}
		var locked []*Lease
		for _, ls := range pending {
			released, found := got[ls]
			switch {
			case !found:
				out[ls] = fmt.Errorf("row taken by a later mandate or lapsed: %w", ErrLost)
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

// releaseOnce sends releaseSQL once no heartbeat round is in flight.
func (l *Locker) releaseOnce(ctx context.Context, leases []*Lease) (map[*Lease]bool, error) {
	if err := l.gate.enter(ctx, false); err != nil {
		return nil, fmt.Errorf("waiting for the heartbeat round in flight: %w", err)
	}
	defer l.gate.leave(false)
	return l.proto.release(ctx, l.conns.release, leases)
}
