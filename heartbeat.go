package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/driver"
)

// minRetry is the shortest wait before retrying a failed heartbeat round.
const minRetry = 10 * time.Millisecond

// heartbeat is the Locker's heartbeat goroutine. Every interval it
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
	if only == nil {
		only = l.reg.all()
	}
	held, until := heldOf(only, time.Now())
	if len(held) == 0 {
		return nil, true
	}
	// The round gives up at the earliest trust deadline, so that a reply
	// that never comes does not hold up the retry of the other leases; the
	// lease itself is lost at that deadline by its own timer. It runs at
	// least until its retry would start anyway (retryAfter from its start):
	// giving up sooner would retry no sooner, and would fail the round for
	// every lease because one of them, locked for a while, is about to lapse.
	begun := time.Now()
	if floor := begun.Add(l.retryAfter()); until.Before(floor) {
		until = floor
	}
	qctx, cancel := context.WithDeadline(ctx, until)
	defer cancel()
	l.round.start(begun)
	// Its connection is had before its turn at the gate, as a release's is
	// (releaseOnce): the releases a waiting round holds up may hold every
	// connection of the pool.
	db, done, err := l.conns.AwaitHeartbeat(qctx)
	leases, sent := held, time.Now()
	var got map[int]driver.Extension
	if err == nil {
		defer l.conns.DropIfEnded(qctx, db, done)()
		if l.gate.EnterRound(ctx) != nil {
			l.round.end(nil)
			return nil, true // Close
		}
		defer l.gate.LeaveRound()
		// Within the gate no release is in flight: a lease released while
		// the round waited is no longer held, and is not extended.
		if leases, _ = heldOf(held, time.Now()); len(leases) == 0 {
			l.round.end(nil)
			return nil, true
		}
		sent = time.Now()
		got, err = l.extendStatement(qctx, db, leases)
	}
	l.round.end(err)
	took := time.Since(sent)
	if ctx.Err() != nil {
		return nil, true // Close: it releases what is held
	}
	if err != nil {
		err = fmt.Errorf("pglease: heartbeat of %d leases: %w", len(leases), err)
		l.cfg.emit(Event{Kind: EventHeartbeatFailed, Err: err, Took: took, Leases: len(leases)})
		now := time.Now()
		for _, ls := range leases {
			ls.checkTrust(now)
		}
		return nil, false
	}
	extended := 0
	// server is the server's clock as the round ran, for the clock-skew
	// reading (the earliest reported: all are within the round trip).
	var server time.Time
	losses := l.lossesOf(ctx, db, leases, func(i int) bool { _, found := got[i]; return !found })
	for i, ls := range leases {
		switch e, found := got[i]; {
		case !found:
			ls.lostInRound(losses[i])
		case e.Locked:
			ls.skipped(sent)
			skipped = append(skipped, ls)
		default:
			ls.extend(e.ExpiresAt, sent)
			extended++
		}
		if e, found := got[i]; found && (server.IsZero() || e.ServerNow.Before(server)) {
			server = e.ServerNow
		}
	}
	var skew Skew
	if !server.IsZero() {
		skew = l.recordSkew(server, sent, took)
	}
	l.cfg.emit(Event{Kind: EventExtended, Took: took, Leases: extended, Skew: skew})
	return skipped, true
}

// heldOf returns the leases of only still held at now (each one's trust
// checked first), and the earliest of their trust deadlines.
func heldOf(only []*Lease, now time.Time) (held []*Lease, until time.Time) {
	for _, ls := range only {
		ls.checkTrust(now)
		ls.mu.Lock()
		ok, trust := ls.err == nil, now.Add(ls.trustUntil.Left(now))
		ls.mu.Unlock()
		if !ok {
			continue
		}
		held = append(held, ls)
		if until.IsZero() || trust.Before(until) {
			until = trust
		}
	}
	return held, until
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
		return fmt.Sprintf("a heartbeat has been in flight for %v, waiting for the server", time.Since(r.sent).Round(time.Millisecond))
	case r.failed != nil:
		return "the last heartbeat failed: " + r.failed.Error()
	}
	return ""
}

// failing reports whether the last heartbeat round failed.
func (r *roundState) failing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed != nil
}

// extendStatement runs one heartbeat round of leases on db
// (driver.Protocol.Extend) and reports by index in leases.
func (l *Locker) extendStatement(ctx context.Context, db DB, leases []*Lease) (map[int]driver.Extension, error) {
	return l.proto.Extend(ctx, db, rowsOf(leases))
}
