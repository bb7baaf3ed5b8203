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
// sooner (interval/4). It does not declare leases lost at their trust
// deadline: each lease's own timer does (Lease.trust), so that a round or a
// release stuck on an unreachable database delays no loss.
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
		timer.Reset(wait)
	}
}

// heartbeatRound extends every held lease once. It reports false when the
// statement failed and should be retried soon.
func (l *Locker) heartbeatRound(ctx context.Context) bool {
	if l.gate.enter(ctx, true) != nil {
		return true // Close
	}
	defer l.gate.leave(true)

	now := time.Now()
	var (
		leases   []*Lease
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
	got, err := l.proto.extend(qctx, l.conns.heartbeat, leases)
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
		if expiresAt, ok := got[ls]; ok {
			ls.extend(expiresAt, sent)
			continue
		}
		ls.lose("heartbeat found the row re-claimed or lapsed")
	}
	l.emit(Event{Kind: EventExtended, Took: took, Leases: len(got)})
	return true
}

// extend runs heartbeatSQL for leases and returns the new expiry of each
// lease whose row still matched.
func (p *fenced) extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]time.Time, error) {
	keys := make([]string, len(leases))
	fences := make([]int64, len(leases))
	byKey := make(map[string]*Lease, len(leases))
	for i, ls := range leases {
		keys[i], fences[i], byKey[ls.key] = ls.key, ls.fence, ls
	}
	rows, err := db.Query(ctx, p.heartbeatSQL, p.holder, p.ttl, keys, fences)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := make(map[*Lease]time.Time, len(leases))
	for rows.Next() {
		var (
			key       string
			fence     int64
			expiresAt time.Time
		)
		if err := rows.Scan(&key, &fence, &expiresAt); err != nil {
			return nil, err
		}
		if ls := byKey[key]; ls != nil && ls.fence == fence {
			got[ls] = expiresAt
		}
	}
	return got, rows.Err()
}
