package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/coalesce"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/flight"
	"github.com/pglease/pglease/internal/keys"
)

// Claim takes the lease on key in one statement, or returns an error
// wrapping ErrHeld while another holder's lease is live. A re-claim by the
// same Locker succeeds with a greater fence, and its previous Lease is lost.
// The lease is extended in the background until Unlock, loss or Close. Claim
// uses ctx as given; Lock adds a timeout. See docs/GUIDE.md, "Locker.Claim".
func (l *Locker) Claim(ctx context.Context, key string) (*Lease, error) {
	mustContext(ctx, "Claim")
	return l.claim(ctx, key, l.terms(), reentrant, flight.Call{})
}

// claimMode is what a claim does with a live lease of its own Locker on
// the key.
type claimMode int

const (
	reentrant claimMode = iota // takes it over with a greater fence (Claim, Lock)
	exclusive                  // counts it held (heldHereError): an attempt of a waiting claim
)

// terms are what one lease is claimed on: how long it lives on the server
// without a heartbeat (ttl), how long its release keeps it after the claim
// (minHold), and how long Lock's claim and Unlock's release may take
// (timeout). A Locker's leases have the Locker's; a JobLocker's have the
// job's. Each lease carries its own, and every statement takes them per
// lease, so that leases of different terms share one heartbeat round and
// one release or claim statement.
type terms struct {
	ttl, minHold, timeout time.Duration
	ticks                 *ticks // WithPeriod: a job whose claims claim ticks (ticks.go)
}

// terms are the Locker's own, from its options.
func (l *Locker) terms() terms {
	return terms{ttl: l.cfg.ttl, minHold: l.cfg.minHold, timeout: l.cfg.timeout}
}

// claim is Claim of a lease on the given terms, the Locker's or a job's,
// in mode. Every claim whose statement may have reached the server leaves
// through settle, which ends what the statement superseded.
func (l *Locker) claim(ctx context.Context, key string, t terms, mode claimMode, parent flight.Call) (*Lease, error) {
	if err := keys.Check(key); err != nil {
		return nil, fmt.Errorf("pglease: claim %q: %w", keys.Short(key), err)
	}
	fctx, call, err := l.inFlight.EnterUnder(ctx, key, parent)
	if err != nil {
		return l.claimFailed(ctx, Event{Kind: EventClaimFailed, Key: key, Err: err})
	}
	ctx = fctx
	defer call.Leave()
	if t.ticks != nil {
		mode = exclusive // a run that outlasts its period keeps its lease
	}
	if err := l.table.check(ctx); err != nil { // at most once per tableRecheck (table.go)
		return l.claimFailed(ctx, Event{Kind: EventClaimFailed, Key: key, Err: err})
	}

	done, err := l.turns.Take(ctx, key)
	if err != nil {
		err = fmt.Errorf("waiting for this Locker's claim of the same key in flight: %w", context.Cause(ctx))
		return l.claimFailed(ctx, Event{Kind: EventClaimFailed, Key: key, Err: err})
	}
	defer func() { done() }() // after register: the next claim of key commits after this one
	if mode == exclusive {
		// Asked in the key's turn, so that no claim of this Locker
		// registers a lease of key between.
		if err := l.ownLease(key); err != nil {
			e := Event{Kind: EventContended, Key: key, Err: err}
			if t.ticks != nil { // no tick asked of the server: Tick stays zero
				e.Err, e.Skipped = fmt.Errorf("tick skipped: the run of an earlier tick still holds the key: %w", err), true
			}
			return l.claimFailed(ctx, e)
		}
	}
	// A fence this claim draws is above every fence a claim of this
	// Locker drew before it was sent: the sequence only grows.
	drawn := l.drawn.Load()
	s := l.sendClaim(ctx, key, t, drawn, &done)
	return l.settle(ctx, call, key, t, drawn, s)
}

// claimFailed reports e, the failure e.Err of a claim of e.Key, once its
// error names the key (and Close, when Close ended the claim), and returns
// that error.
func (l *Locker) claimFailed(ctx context.Context, e Event) (*Lease, error) {
	if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) && !errors.Is(e.Err, ErrClosed) {
		e.Err = fmt.Errorf("%w: %w", e.Err, cause) // Close ended the claim
	}
	e.Err, e.Context = &claimError{e.Key, e.Err}, ctx
	l.cfg.emit(e)
	return nil, e.Err
}

// sawDrawn records fence, drawn by a claim of this Locker.
func (l *Locker) sawDrawn(fence int64) {
	for was := l.drawn.Load(); fence > was && !l.drawn.CompareAndSwap(was, fence); was = l.drawn.Load() {
	}
}

// sent is what became of one claim statement.
type sent struct {
	c    driver.Claimed
	tick *driver.TickClaim // a claim of a tick: the tick, and the row that refused it
	ok   bool              // a row came back: the key was taken (new, expired, or our own)
	at   time.Time         // when the statement was sent: the trust window counts from it
	err  error
	fate fate
}

// fate says what a failed claim statement may have written.
type fate int

const (
	answered fate = iota // the server's answer came back (a row, no row, or its error)
	notSent              // it never reached the server
	unknown              // it may have committed: the reply was lost, or ctx ended in flight
	orphaned             // the coalescer settles it once its statement returns (orphanClaim)
)

// fateOf classifies err, the failure of a claim statement, as
// driver.OutcomeOf does.
func fateOf(err error) fate {
	switch driver.OutcomeOf(err) {
	case driver.Done:
		return answered
	case driver.NotSent:
		return notSent
	}
	return unknown
}

// settle is the one exit of a claim whose statement may have reached the
// server: it enumerates what the statement can have done, and for every
// case in which it may have written the row without handing out a lease,
// ends the Locker's previous lease of key first (the row has a new fence,
// and maybe a shorter expiry) and gives the row back.
func (l *Locker) settle(ctx context.Context, call flight.Call, key string, t terms, drawn int64, s sent) (*Lease, error) {
	took := time.Since(s.at)
	fail := func(kind EventKind, fence int64, err error) (*Lease, error) {
		return l.claimFailed(ctx, Event{Kind: kind, Key: key, Fence: fence, Err: err, Took: took})
	}
	switch {
	case s.err != nil && s.fate == unknown:
		l.supersede(key, "re-claimed by the same holder in a claim whose outcome is unknown")
		call.Note(leftBehind(key, l.giveBackUnknown(ctx, key, t, drawn, driver.Answered(s.err))))
		return fail(EventClaimFailed, 0, driver.WithCause(ctx, s.err))
	case s.err != nil: // nothing was written, or the coalescer settles it
		return fail(EventClaimFailed, 0, driver.WithCause(ctx, s.err))
	case !s.ok && s.tick != nil:
		th := &tickHeldError{tick: s.tick.Tick, rowTick: s.tick.RowTick, holder: s.tick.Holder,
			fence: s.tick.Fence, live: s.tick.Live, released: s.tick.Released, run: s.tick.IsRun}
		return l.claimFailed(ctx, Event{Kind: EventContended, Key: key, Err: th, Took: took, Tick: th.tick, Skipped: th.skipped()})
	case !s.ok:
		return fail(EventContended, 0, ErrHeld)
	case !s.c.Live:
		// The claim waited on the row lock past its own expiry. The row
		// carries our holder but is already expired: it is nobody's lease.
		// It also has a new fence: the previous lease is over.
		l.supersede(key, "re-claimed by the same holder")
		l.sawDrawn(s.c.Fence)
		return fail(EventClaimFailed, s.c.Fence, fmt.Errorf("expired while waiting on the row lock for %v: %w", took, ErrLost))
	case !l.cfg.noFence && s.c.Fence <= drawn:
		// A fence this Locker drew before may be another lease's now, or
		// a fenced store's: the row is given back, on exactly its fence.
		l.supersede(key, "re-claimed by the same holder")
		call.Note(leftBehind(key, l.giveBack(ctx, &Lease{key: key, holder: s.c.Holder, fence: s.c.Fence, acquiredAt: s.c.AcquiredAt, terms: t})))
		table, _ := driver.ParseTable(l.cfg.table) // checked by newConfig
		return fail(EventClaimFailed, s.c.Fence, table.DrewBackwards(s.c.Fence, drawn))
	}
	l.sawDrawn(s.c.Fence)
	trustUntil := l.trustDeadline(s.at, t.ttl)
	if trustUntil.Left(time.Now()) <= 0 {
		// Live on the server, but the round trip ate the whole trust
		// window: the Locker could not vouch for it for a moment. Its row
		// is given back, on exactly its fence.
		l.supersede(key, "re-claimed by the same holder")
		call.Note(leftBehind(key, l.giveBack(ctx, &Lease{key: key, holder: s.c.Holder, fence: s.c.Fence, acquiredAt: s.c.AcquiredAt, terms: t})))
		return fail(EventClaimFailed, s.c.Fence, fmt.Errorf("took %v, longer than the trust window: %w", took, ErrLost))
	}

	lease := &Lease{
		locker:     l,
		key:        key,
		holder:     s.c.Holder,
		fence:      s.c.Fence,
		acquiredAt: s.c.AcquiredAt,
		table:      s.c.Table,
		terms:      t,
		tick:       tickOf(s),
		expiresAt:  s.c.ExpiresAt,
		trustUntil: trustUntil,
	}
	// Reported before the lease becomes visible to the heartbeat and Close,
	// so that its end can never be reported before its start.
	skew := l.recordSkew(s.c.AcquiredAt, s.at, took)
	l.cfg.emit(Event{Kind: EventAcquired, Key: key, Holder: s.c.Holder, Fence: s.c.Fence, Took: took, Skew: skew, Context: ctx,
		Tick: tickOf(s), CaughtUp: t.ticks != nil && !t.ticks.catchUp.IsZero()})
	prev, err := l.reg.add(lease, l.beat)
	if err != nil {
		// Close ran while the claim was in flight: give the row back (the
		// release is reported like any other).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
		if err := l.release(rctx, lease, ErrClosed); err != nil && !errors.Is(err, ErrLost) {
			call.Note(&leftBehindError{key, lease.fence, err})
		}
		cancel()
		return nil, fmt.Errorf("pglease: claim %q: %w", key, err)
	}
	if prev != nil {
		prev.lose("re-claimed by the same holder")
	}
	// Armed once the lease is registered, so that the timer's loss is
	// always reported after the acquisition and forgets a registered lease.
	lease.mu.Lock()
	if lease.err == nil {
		lease.trust(s.at)
	}
	lease.mu.Unlock()
	l.watch()
	return lease, nil
}

// tickOf is the tick a claim took, if it claimed one.
func tickOf(s sent) time.Time {
	if s.tick == nil {
		return time.Time{}
	}
	return s.tick.Tick
}

// supersede ends the Locker's lease of key, if it has one, after a claim
// statement may have written the row for this holder without handing out a
// lease: the row has a new fence, so the previous lease is over.
func (l *Locker) supersede(key, why string) {
	if prev := l.reg.get(key); prev != nil {
		prev.lose(why)
	}
}

// maxBurstLockWait is the longest a burst's claim statement waits on one row
// lock (lock_timeout) before its claims are sent again one by one: another
// replica's claim holds a row for one commit, a few milliseconds; only an
// open transaction costs this wait. It is also how long a claim sent alone
// keeps its place in flight (coalesce.Coalescer.Linger) while it waits on
// a row lock.
const maxBurstLockWait = 500 * time.Millisecond

// maxAloneLockWait is the longest one claim sent with a lock wait (when
// claims may not wait on a row lock without bound, claimBound.mayWait)
// waits on its row's lock before it gives its connection back, to be sent
// again after a pause as a release is: far longer than one commit, and the
// longest a claim of a free key waits for a connection behind it.
const maxAloneLockWait = 50 * time.Millisecond

// claimOutcome is what the statement that carried one claim said of it.
type claimOutcome struct {
	c     driver.Claimed
	ok    bool // taken; false with a nil err: held by another
	err   error
	sent  time.Time // when that statement was sent: the trust window counts from it
	alone bool      // the statement failed on something one row may cause: send this claim again alone
	// locked: it was the statement of this claim alone, and its row was
	// locked past its lock wait: send it again after a pause.
	locked bool
}

// claimCall is one claim handed to the coalescer, with its terms and the
// end of its key's turn, which the coalescer calls if the caller stops
// waiting.
type claimCall struct {
	key   string
	terms terms
	drawn int64 // no fence this claim draws is at or below it (claim)
	done  func()
}

// newClaims is the coalescer of a Locker's claims, or nil when its
// protocol sends them one by one.
func (l *Locker) newClaims() *coalesce.Coalescer[claimCall, claimOutcome] {
	if !l.proto.Bursts() {
		return nil
	}
	return &coalesce.Coalescer[claimCall, claimOutcome]{Send: l.sendClaims, Orphan: l.orphanClaim, Limit: l.conns.ClaimLimit(maxAloneInFlight), Linger: burstLockWait(l.cfg.ttl)}
}

// maxAloneInFlight is how many claim (or release) statements of a Locker
// may be in flight before the next calls queue and go together: the
// connections of pgxpool's smallest default pool. A few job runs at once
// then go as they always did, one statement each, in parallel on their own
// connections, and lose no round trip waiting for each other (with one
// statement in flight, 4 concurrent job runs were 10% slower); a tick of
// dozens of jobs costs at most this many statements, plus one.
const maxAloneInFlight = 4

// sendClaim sends the claim of key on terms t, alone or with the others of
// a burst, and returns what became of its statement. done ends key's turn;
// if ctx ends while the claim is in a statement, sendClaim hands it to the
// coalescer, which calls it once that statement has returned, and
// replaces it with a no-op.
func (l *Locker) sendClaim(ctx context.Context, key string, t terms, drawn int64, done *func()) sent {
	if t.ticks != nil {
		return l.claimAlone(ctx, key, t, 0) // its statement is its own (sqlstmt.ClaimTick)
	}
	if l.claims == nil {
		return l.claimAlone(ctx, key, t, 0)
	}
	o, handedOff, err := l.claims.Do(ctx, claimCall{key: key, terms: t, drawn: drawn, done: *done})
	switch {
	case handedOff:
		*done = func() {}
		return sent{at: time.Now(), err: fmt.Errorf("waiting for the claim statement in flight: %w", err), fate: orphaned}
	case err != nil:
		return sent{at: time.Now(), err: fmt.Errorf("waiting for the claim statement in flight to return: %w", err), fate: notSent}
	case o.alone && o.locked:
		return l.claimAlone(ctx, key, t, firstLockedRetry)
	case o.alone:
		return l.claimAlone(ctx, key, t, 0)
	}
	return sent{c: o.c, ok: o.ok, at: o.sent, err: o.err, fate: fateOf(o.err)}
}

// claimAlone sends the claim of key in a statement of its own, after
// pause if not zero. A claim that may not wait on a row lock without bound
// (claimBound.mayWait) is sent with a lock wait (aloneLockWait), and while its row stays locked past it, sent again
// after a pause that doubles up to maxLockedRetry: between two attempts it
// holds no connection.
func (l *Locker) claimAlone(ctx context.Context, key string, t terms, pause time.Duration) sent {
	for {
		if pause > 0 {
			timer := time.NewTimer(pause)
			select {
			case <-ctx.Done():
				timer.Stop()
				return sent{at: time.Now(), err: fmt.Errorf("row locked by another transaction past each wait of the claim on it (SQLSTATE 55P03): %w", context.Cause(ctx)), fate: notSent}
			case <-timer.C:
			}
		}
		if l.conns.MayWait() {
			s := l.claimOne(ctx, key, t, 0)
			l.conns.Waited()
			return s
		}
		s := l.claimOne(ctx, key, t, aloneLockWait(t.ttl))
		if !driver.Is(s.err, driver.LockNotAvailable) {
			return s
		}
		pause = min(max(2*pause, firstLockedRetry), maxLockedRetry)
	}
}

// claimOne sends the claim of key alone, waiting on its row's lock at most
// lockWait (0: as long as it is held): the claim statement, or for a job of
// ticks the claim of the tick nearest the server's clock.
func (l *Locker) claimOne(ctx context.Context, key string, t terms, lockWait time.Duration) sent {
	at := time.Now()
	if t.ticks == nil {
		c, ok, err := l.proto.Claim(ctx, l.conns.Claim(), key, t.ttl, lockWait)
		return sent{c: c, ok: ok, at: at, err: err, fate: fateOf(err)}
	}
	around := l.clock.Wall(at) // a crontab's instants around this replica's clock
	for attempt := 1; ; attempt++ {
		tk, err := t.ticks.claim(around)
		if err != nil {
			return sent{at: at, err: fmt.Errorf("%s: %w", t.ticks.crontab, err), fate: notSent}
		}
		tc, err := l.proto.ClaimTick(ctx, l.conns.Claim(), key, t.ttl, lockWait, tk)
		f := fateOf(err) // a stale claim was answered: it took nothing
		switch {
		case err == nil && tc.Stale && attempt < maxStaleClaims:
			// The server's clock was outside the instants sent: around
			// it, as late as this statement was, instead.
			around, at = tc.AcquiredAt.Add(time.Since(at)), time.Now()
			continue
		case err == nil && tc.Stale:
			err = fmt.Errorf("the database server's clock read %v, outside the instants of %s sent around %v, %d times: this replica's clock and the server's differ by more than half the time between two instants, or each claim took that long to reach the server",
				tc.AcquiredAt.UTC().Format(time.RFC3339Nano), t.ticks.crontab, around.UTC().Format(time.RFC3339Nano), attempt)
		case driver.Is(err, driver.UndefinedTable):
			err = fmt.Errorf("%w (a job with ticks enters its runs in the ledger beside the lease table: run Migrate, or apply pglease.Schema())", err)
		}
		return sent{c: tc.Claimed, tick: &tc, ok: tc.Took, at: at, err: err, fate: f}
	}
}

// maxStaleClaims is how many times a claim of a crontab's tick is sent
// when the server's clock lies outside the instants it sent.
const maxStaleClaims = 3

// sendClaims is the coalescer's statement: the claim statement for a claim
// alone that may wait on a row lock without bound (claimBound.mayWait), the
// burst's (sqlstmt.ClaimAll) for a burst and for a claim alone that may not,
// waiting on a row lock for burstLockWait (aloneLockWait for one claim, or
// when claims may not wait without bound). When it fails on an error one
// row may cause (driver.RowError), each claim goes again alone, so that one
// row fails only its own claim; any other failure (the connection, the
// server shutting down) fails every claim of the statement, with its cause.
func (l *Locker) sendClaims(ctx context.Context, calls []claimCall, out []claimOutcome) {
	sent := time.Now()
	if len(calls) == 1 && l.conns.MayWait() {
		c, ok, err := l.proto.Claim(ctx, l.conns.Claim(), calls[0].key, calls[0].terms.ttl, 0)
		l.conns.Waited()
		out[0] = claimOutcome{c: c, ok: ok, err: err, sent: sent}
		return
	}
	keys := make([]string, len(calls))
	ttls := make([]float64, len(calls))
	shortest := calls[0].terms.ttl
	for i, cl := range calls {
		keys[i], ttls[i] = cl.key, cl.terms.ttl.Seconds()
		shortest = min(shortest, cl.terms.ttl)
	}
	wait := burstLockWait(shortest)
	if len(calls) == 1 || l.conns.Pressed() {
		// On the last connection claims may hold: the claims of free keys
		// wait for it no longer than this.
		wait = aloneLockWait(shortest)
	}
	got, err := l.proto.ClaimAll(ctx, l.conns.Claim(), keys, ttls, wait)
	for i, key := range keys {
		c, ok := got[key]
		switch {
		case err != nil && driver.RowError(ctx, err):
			out[i] = claimOutcome{alone: true, locked: len(calls) == 1 && driver.Is(err, driver.LockNotAvailable)}
		case err != nil:
			out[i] = claimOutcome{err: fmt.Errorf("claim statement of %d keys: %w", len(keys), err), sent: sent}
		default:
			out[i] = claimOutcome{c: c, ok: ok, sent: sent}
		}
	}
}

// burstLockWait is maxBurstLockWait, or a quarter of the trust window of
// ttl when that is shorter: a burst that waited longer would leave its
// claims little of their window. A burst counts its shortest TTL.
func burstLockWait(ttl time.Duration) time.Duration {
	return min(maxBurstLockWait, (ttl-trustMargin(ttl))/4)
}

// aloneLockWait is maxAloneLockWait, or burstLockWait(ttl) if shorter.
func aloneLockWait(ttl time.Duration) time.Duration { return min(maxAloneLockWait, burstLockWait(ttl)) }

// orphanClaim settles a claim whose caller stopped waiting while its
// statement was in flight (its Claim returned the context's error), as
// settle would have, then ends its key's turn: whatever the statement may
// have written ends the previous lease and is given back, on exactly its
// fence (read first when the outcome is unknown). Nobody holds that lease: released now,
// the key is free for others at once instead of at its expiry.
func (l *Locker) orphanClaim(cl claimCall, o claimOutcome) {
	defer cl.done()
	switch {
	case o.alone, o.err == nil && !o.ok:
		return // the statement failed on a row, or found the key held: nothing written
	case o.err != nil:
		if fateOf(o.err) == unknown {
			l.supersede(cl.key, "re-claimed by the same holder in a claim whose caller gave up and whose outcome is unknown")
			l.orphanLeftBehind(cl.key, l.giveBackUnknown(context.Background(), cl.key, cl.terms, cl.drawn, driver.Answered(o.err)))
		}
		return
	}
	// The row is this claim's now: a lease of the key this Locker held is
	// a previous lease, and must stop believing before the row is given
	// back and another holder can take it.
	l.supersede(cl.key, "re-claimed by the same holder, in a claim whose caller gave up")
	l.sawDrawn(o.c.Fence)
	if o.c.Live {
		l.orphanLeftBehind(cl.key, l.giveBack(context.Background(), &Lease{key: cl.key, holder: o.c.Holder, fence: o.c.Fence, acquiredAt: o.c.AcquiredAt, terms: cl.terms}))
	}
}
