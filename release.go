package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// releaseSQL gives leases back by expiring their rows in place, never by
// DELETE, in one statement and one round trip whatever their number (Unlock
// sends one lease, Close every lease it holds: released one by one, a few
// hundred leases at a few milliseconds per round trip would outlast Close's
// timeout). It reports on each lease: released, or skipped because its row
// is locked by another transaction. A lease missing from the result was
// lost (ErrLost).
//
//   - The guard (holder, fence, not expired) makes a previous mandate's late
//     release touch nothing, and the row of a later mandate is untouched.
//     COLLATE "C": holders are compared byte for byte, whatever collation
//     the column has.
//   - FOR NO KEY UPDATE SKIP LOCKED, the lock the UPDATE takes anyway: a
//     row locked by another transaction (an operator's, a guarded job's,
//     another replica's claim in flight) is skipped, not waited for. A
//     waiting release would hold up the other leases of Close, and, since a
//     heartbeat round may not run while a release is in flight, every
//     heartbeat of the Locker. Skipped rows are told from lost ones as the
//     heartbeat does (the last committed version still matches) and sent
//     again by the Locker, each attempt on its own.
//   - GREATEST(clock_timestamp(), acquired_at + min hold) keeps the lease
//     until the min hold has passed since the claim (WithMinHold), and
//     otherwise expires it now. Each lease has its own min hold ($2, one
//     per key, beside the keys and fences: a job's, Locker.Job, or the
//     Locker's), so one statement releases leases of every job. The hold is at least 1 microsecond
//     (timestamptz's resolution): after the server's clock steps back,
//     clock_timestamp() can fall at or before acquired_at, and the CHECK
//     (expires_at > acquired_at) would fail the statement. The row then
//     stays held until the clock has caught up with acquired_at.
//   - set_config('synchronous_commit', 'off', true) makes this statement
//     commit without waiting for the WAL flush (the setting is read at
//     commit, before the transaction-local value is reverted). A release
//     lost in a crash only makes the lease last until its expiry: liveness,
//     never safety. Claims and heartbeats stay synchronous, and the next
//     synchronous commit flushes the WAL up to and including this release.
//   - pg_notify({chanlit}, key) in RETURNING wakes the claims waiting for
//     the released keys (ClaimWait, an Elector's followers) in the same
//     statement, at its commit: no added statement or round trip. RETURNING
//     runs only for rows actually released, never for a skipped or lost one.
const releaseSQL = `WITH r AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[]) AS r(key, fence, min_hold)
), mine AS (
  SELECT l.key, r.min_hold FROM {table} AS l JOIN r ON l.key = r.key AND l.fence = r.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               l.acquired_at + make_interval(secs => mine.min_hold),
                               l.acquired_at + interval '1 microsecond')
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL
  RETURNING l.key, l.fence, pg_notify({chanlit}, l.key)
)
SELECT key, fence, true FROM released
UNION ALL
SELECT c.key, c.fence, false
  FROM r JOIN {table} AS c ON c.key = r.key AND c.fence = r.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM released)`

// unfencedReleaseSQL is releaseSQL matching each row on its forged holder,
// with each lease's min hold ($1, one per key) counted from the acquired
// time each claim returned (a server time), since the table may have no
// acquired_at column. It wakes the waiting claims of the released keys as
// releaseSQL does.
const unfencedReleaseSQL = `WITH r AS (
  SELECT * FROM unnest($2::text[], $3::text[], $4::timestamptz[], $1::float8[]) AS r(key, holder, acquired_at, min_hold)
), mine AS (
  SELECT l.key, r.acquired_at, r.min_hold FROM {table} AS l JOIN r ON l.key = r.key AND l.holder = r.holder COLLATE "C"
   WHERE l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               mine.acquired_at + make_interval(secs => mine.min_hold),
                               mine.acquired_at + interval '1 microsecond')
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL
  RETURNING l.key, l.holder, pg_notify({chanlit}, l.key)
)
SELECT key, holder, true FROM released
UNION ALL
SELECT c.key, c.holder, false
  FROM r JOIN {table} AS c ON c.key = r.key AND c.holder = r.holder COLLATE "C"
 WHERE c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM released)`

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
