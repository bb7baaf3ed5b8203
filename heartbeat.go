package pglease

import (
	"context"
	"fmt"
	"time"
)

// heartbeatSQL extends every lease of the Locker in one statement per round,
// whatever their number.
//
//   - The guard (holder, fence, not expired) extends only the very mandate
//     the Locker holds: a row re-claimed by anyone, the same holder included,
//     has another fence, and a lapsed row is not revived.
//   - A lease missing from RETURNING is lost, for good.
//   - clock_timestamp(), not now(): the server's time when the row is
//     updated, not when the transaction started.
const heartbeatSQL = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
  FROM unnest($3::text[], $4::bigint[]) AS h(key, fence)
 WHERE l.key = h.key AND l.holder = $1 AND l.fence = h.fence
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`

// minRetry is the shortest wait before retrying a failed heartbeat round.
const minRetry = 10 * time.Millisecond

// heartbeat is the Locker's one background goroutine. Every interval it
// extends all held leases in one statement. After a failed round it retries
// sooner (interval/4), and it always wakes at the earliest trust deadline so
// that a lease nobody could extend is declared lost on time, database
// reachable or not.
func (l *Locker) heartbeat(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	timer := time.NewTimer(l.cfg.heartbeat)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		wait := l.cfg.heartbeat
		if !l.heartbeatRound(ctx) {
			wait = max(l.cfg.heartbeat/4, minRetry)
		}
		if next := l.earliestTrustDeadline(); !next.IsZero() {
			wait = min(wait, max(time.Until(next), 0))
		}
		timer.Reset(wait)
	}
}

// heartbeatRound extends every held lease once. It reports false when the
// statement failed and should be retried soon.
func (l *Locker) heartbeatRound(ctx context.Context) bool {
	select {
	case l.round <- struct{}{}:
	case <-ctx.Done():
		return true
	}
	defer func() { <-l.round }()

	now := time.Now()
	var (
		leases   []*Lease
		keys     []string
		fences   []int64
		deadline time.Time
	)
	for _, ls := range l.snapshot() {
		ls.checkTrust(now)
		ls.mu.Lock()
		held, trust := ls.err == nil, ls.trustUntil
		ls.mu.Unlock()
		if !held {
			continue
		}
		leases = append(leases, ls)
		keys = append(keys, ls.key)
		fences = append(fences, ls.fence)
		if deadline.IsZero() || trust.Before(deadline) {
			deadline = trust
		}
	}
	if len(leases) == 0 {
		return true
	}

	// The round may not outlive the earliest trust deadline: past it that
	// lease must be declared lost, whatever the network does.
	qctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	sent := time.Now()
	got, err := l.extendRows(qctx, keys, fences)
	took := time.Since(sent)
	if ctx.Err() != nil {
		return true // Close: it releases what is held
	}
	if err != nil {
		err = fmt.Errorf("pglease: heartbeat of %d leases: %w", len(leases), err)
		l.emit(Event{Kind: EventHeartbeatFailed, Err: err, Took: took, Leases: len(leases)})
		now := time.Now()
		for _, ls := range leases {
			ls.checkTrust(now)
		}
		return false
	}
	for _, ls := range leases {
		row, ok := got[ls.key]
		if ok && row.fence == ls.fence {
			ls.extend(row.expiresAt, sent)
			continue
		}
		ls.lose("heartbeat found the row re-claimed or lapsed")
	}
	l.emit(Event{Kind: EventExtended, Took: took, Leases: len(got)})
	return true
}

type extended struct {
	fence     int64
	expiresAt time.Time
}

// extendRows runs heartbeatSQL and collects what it extended, by key.
func (l *Locker) extendRows(ctx context.Context, keys []string, fences []int64) (map[string]extended, error) {
	rows, err := l.db.Query(ctx, l.heartbeatSQL, l.cfg.holder, l.cfg.ttl.Seconds(), keys, fences)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := make(map[string]extended, len(keys))
	for rows.Next() {
		var (
			key string
			row extended
		)
		if err := rows.Scan(&key, &row.fence, &row.expiresAt); err != nil {
			return nil, err
		}
		got[key] = row
	}
	return got, rows.Err()
}

// earliestTrustDeadline is the soonest trust deadline among held leases, or
// zero when none is held.
func (l *Locker) earliestTrustDeadline() time.Time {
	var first time.Time
	for _, ls := range l.snapshot() {
		ls.mu.Lock()
		held, trust := ls.err == nil, ls.trustUntil
		ls.mu.Unlock()
		if held && (first.IsZero() || trust.Before(first)) {
			first = trust
		}
	}
	return first
}
