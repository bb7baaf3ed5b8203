package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// minRetry is the shortest wait before retrying a failed heartbeat round.
const minRetry = 10 * time.Millisecond

// extension is what a heartbeat round found for one lease. A lease the
// round reports nothing for is lost.
type extension struct {
	expiresAt time.Time // the new server expiry, if extended
	locked    bool      // not extended: the row is locked by another transaction, and still matched as last committed
}

// heartbeat is the Locker's one background goroutine. Every interval it
// extends all held leases in one statement. Rounds are timed from their
// start, so that slow rounds do not stretch the period until leases lapse.
// After a failed round it retries every lease sooner (interval/4); leases a
// round skipped because their rows were locked are retried alone as soon,
// until the next full round. It does not declare leases lost at their trust
// deadline: each lease's own timer does (Lease.trust), so that a round or a
// release stuck on an unreachable database delays no loss, and a row locked
// past it costs that lease alone.
func (l *Locker) heartbeat(ctx context.Context, done chan<- struct{}) {
	defer close(done)
	interval, retry := l.cfg.heartbeat, l.retryAfter()
	due := time.Now().Add(interval) // the next round of every lease
	var locked []*Lease             // retried alone until then
	timer := time.NewTimer(interval)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-timer.C:
		}
		start := time.Now()
		var only []*Lease // nil: every lease
		if start.Before(due) && len(locked) > 0 {
			only = locked
		}
		skipped, ok := l.heartbeatRound(ctx, only)
		switch {
		case !ok:
			due, locked = start.Add(retry), nil
		case only == nil:
			due, locked = start.Add(interval), skipped
		default:
			locked = skipped
		}
		next := due
		if soon := start.Add(retry); len(locked) > 0 && soon.Before(due) {
			next = soon
		}
		timer.Reset(time.Until(next))
	}
}

// retryAfter is how soon a failed round is retried, and a lease whose row
// was locked: interval/4.
func (l *Locker) retryAfter() time.Duration { return max(l.cfg.heartbeat/4, minRetry) }

// heartbeatRound extends the given leases, or every held lease when only
// is nil, once. It returns the leases it skipped because their rows were
// locked, and reports false when the statement failed and should be
// retried soon.
func (l *Locker) heartbeatRound(ctx context.Context, only []*Lease) (skipped []*Lease, ok bool) {
	if l.gate.enter(ctx, true) != nil {
		return nil, true // Close
	}
	defer l.gate.leave(true)

	if only == nil {
		only = l.snapshot()
	}
	now := time.Now()
	var (
		leases   []*Lease
		deadline time.Time
	)
	for _, ls := range only {
		ls.checkTrust(now)
		ls.mu.Lock()
		held, trust := ls.err == nil, now.Add(ls.trustUntil.left(l, now))
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
		return nil, true
	}

	// The round gives up at the earliest trust deadline, so that a reply
	// that never comes does not hold up the retry of the other leases; the
	// lease itself is lost at that deadline by its own timer. It runs at
	// least until its retry would start anyway (retryAfter from its start):
	// giving up sooner would retry no sooner, and would fail the round for
	// every lease because one of them, locked for a while, is about to lapse.
	sent := time.Now()
	if floor := sent.Add(l.retryAfter()); deadline.Before(floor) {
		deadline = floor
	}
	qctx, cancel := context.WithDeadline(ctx, deadline)
	defer cancel()
	l.round.start(sent)
	got, err := l.proto.extend(qctx, l.conns.heartbeat, leases)
	l.round.end(err)
	took := time.Since(sent)
	if ctx.Err() != nil {
		return nil, true // Close: it releases what is held
	}
	if err != nil {
		err = fmt.Errorf("pglease: heartbeat of %d leases: %w", len(leases), err)
		l.emit(Event{Kind: EventHeartbeatFailed, Err: err, Took: took, Leases: len(leases)})
		now := time.Now()
		for _, ls := range leases {
			ls.checkTrust(now)
		}
		return nil, false
	}
	extended := 0
	for _, ls := range leases {
		switch e, found := got[ls]; {
		case !found:
			ls.lose("heartbeat found the row re-claimed or lapsed")
		case e.locked:
			ls.skipped(sent)
			skipped = append(skipped, ls)
		default:
			ls.extend(e.expiresAt, sent)
			extended++
		}
	}
	l.emit(Event{Kind: EventExtended, Took: took, Leases: extended})
	return skipped, true
}

// roundState is what the heartbeat round is doing, so that a lease lost at
// its trust deadline can say why no round extended it.
type roundState struct {
	mu     sync.Mutex
	sent   time.Time // when the round in flight was sent; zero when none is
	failed error     // the last round's failure; nil once one succeeded
}

func (r *roundState) start(sent time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent = sent
}

func (r *roundState) end(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if errors.Is(err, context.DeadlineExceeded) {
		err = fmt.Errorf("no reply from the server within %v (a lock on the table, an overloaded or unreachable server): %w", time.Since(r.sent).Round(time.Millisecond), err)
	}
	r.sent, r.failed = time.Time{}, err
}

// cause names a round in flight or the last round's failure; empty when
// neither.
func (r *roundState) cause() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case !r.sent.IsZero():
		return fmt.Sprintf("a heartbeat round has been in flight for %v, waiting for the server", time.Since(r.sent).Round(time.Millisecond))
	case r.failed != nil:
		return "the last heartbeat round failed: " + r.failed.Error()
	}
	return ""
}

// extend runs heartbeatSQL for leases, each with its own TTL, and reports
// on each lease whose row still matched.
func (p *fenced) extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error) {
	keys := make([]string, len(leases))
	fences := make([]int64, len(leases))
	for i, ls := range leases {
		keys[i], fences[i] = ls.key, ls.fence
	}
	ttls := seconds(leases, func(t terms) time.Duration { return t.ttl })
	rows, err := db.Query(ctx, p.heartbeatSQL, p.holder, ttls, keys, fences)
	if err != nil {
		return nil, err
	}
	return readRound(rows, leases, func(ls *Lease, fence int64) bool { return ls.fence == fence })
}

// readRound reads what a heartbeat statement reported: the key and mandate
// (fence or holder) of each row, with its new expiry if extended, NULL if
// skipped because it was locked. A lease reported neither way is left out:
// it is lost.
func readRound[M any](rows pgx.Rows, leases []*Lease, same func(*Lease, M) bool) (map[*Lease]extension, error) {
	defer rows.Close()
	byKey := make(map[string]*Lease, len(leases))
	for _, ls := range leases {
		byKey[ls.key] = ls
	}
	got := make(map[*Lease]extension, len(leases))
	for rows.Next() {
		var (
			key       string
			mandate   M
			expiresAt *time.Time
		)
		if err := rows.Scan(&key, &mandate, &expiresAt); err != nil {
			return nil, err
		}
		if ls := byKey[key]; ls != nil && same(ls, mandate) {
			if expiresAt == nil {
				got[ls] = extension{locked: true}
			} else {
				got[ls] = extension{expiresAt: *expiresAt}
			}
		}
	}
	return got, rows.Err()
}
