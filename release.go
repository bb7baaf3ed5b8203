package pglease

import (
	"context"
	"fmt"
	"time"
)

// releaseAllSQL is releaseSQL for every lease Close gives back, in one
// statement and one round trip whatever their number: released one by one,
// a few hundred leases at a few milliseconds per round trip would outlast
// Close's timeout, and the rest would lapse only at their expiry.
//
//   - Same guard per row as releaseSQL (holder, fence, not expired): a
//     previous mandate's row is untouched, and a lease missing from
//     RETURNING was lost (ErrLost).
//   - Same expiry: the min hold counted from acquired_at, and never at or
//     before acquired_at, which the CHECK (expires_at > acquired_at) would
//     reject for a lease released within the microsecond of its claim.
//   - Asynchronous commit, as for releaseSQL: a release lost in a crash
//     only lets the lease last until its expiry.
const releaseAllSQL = `UPDATE {table} AS l
   SET expires_at = GREATEST(clock_timestamp(),
                             l.acquired_at + make_interval(secs => $2),
                             l.acquired_at + interval '1 microsecond')
  FROM unnest($3::text[], $4::bigint[]) AS r(key, fence)
 WHERE l.key = r.key AND l.holder = $1 AND l.fence = r.fence
   AND l.expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING l.key, l.fence`

// unfencedReleaseAllSQL is releaseAllSQL matching each row on its forged
// holder, with the min hold counted from the acquired time each claim
// returned, since the table may have no acquired_at column.
const unfencedReleaseAllSQL = `UPDATE {table} AS l
   SET expires_at = GREATEST(clock_timestamp(),
                             r.acquired_at + make_interval(secs => $1),
                             r.acquired_at + interval '1 microsecond')
  FROM unnest($2::text[], $3::text[], $4::timestamptz[]) AS r(key, holder, acquired_at)
 WHERE l.key = r.key AND l.holder = r.holder COLLATE "C"
   AND l.expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL
RETURNING l.key, l.holder`

func (p *fenced) releaseAll(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	keys := make([]string, len(leases))
	fences := make([]int64, len(leases))
	byKey := make(map[string]*Lease, len(leases))
	for i, ls := range leases {
		keys[i], fences[i], byKey[ls.key] = ls.key, ls.fence, ls
	}
	rows, err := db.Query(ctx, p.releaseAllSQL, p.holder, p.minHold, keys, fences)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := make(map[*Lease]bool, len(leases))
	for rows.Next() {
		var (
			key   string
			fence int64
		)
		if err := rows.Scan(&key, &fence); err != nil {
			return nil, err
		}
		if ls := byKey[key]; ls != nil && ls.fence == fence {
			got[ls] = true
		}
	}
	return got, rows.Err()
}

func (p *unfenced) releaseAll(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	keys := make([]string, len(leases))
	holders := make([]string, len(leases))
	acquired := make([]time.Time, len(leases))
	byKey := make(map[string]*Lease, len(leases))
	for i, ls := range leases {
		keys[i], holders[i], acquired[i], byKey[ls.key] = ls.key, ls.holder, ls.acquiredAt, ls
	}
	rows, err := db.Query(ctx, p.t.render(unfencedReleaseAllSQL), p.minHold, keys, holders, acquired)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := make(map[*Lease]bool, len(leases))
	for rows.Next() {
		var key, holder string
		if err := rows.Scan(&key, &holder); err != nil {
			return nil, err
		}
		if ls := byKey[key]; ls != nil && ls.holder == holder {
			got[ls] = true
		}
	}
	return got, rows.Err()
}

// releaseAll ends every lease with ended and expires their rows in one
// statement, ordered after any heartbeat round in flight, and reports each
// lease's outcome as release does. A lease whose release was already
// attempted (a concurrent Unlock) is left to it. It returns the outcome of
// each lease released here.
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
	released, err := l.releaseRows(ctx, batch)
	errs := make([]error, len(batch))
	for i, r := range batch {
		errs[i] = l.finishRelease(r, releaseOutcome(r.prior, err, released[r.ls]))
	}
	return errs
}

// releaseRows sends releaseAllSQL for batch once no heartbeat round is in
// flight.
func (l *Locker) releaseRows(ctx context.Context, batch []releasing) (map[*Lease]bool, error) {
	if err := l.gate.enter(ctx, false); err != nil {
		return nil, fmt.Errorf("waiting for the heartbeat round in flight: %w", err)
	}
	defer l.gate.leave(false)

	leases := make([]*Lease, len(batch))
	for i, r := range batch {
		leases[i] = r.ls
	}
	return l.proto.releaseAll(ctx, l.conns.release, leases)
}
