package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/driver"
)

// Claim takes the lease on key in one statement, or returns an error wrapping
// ErrHeld while another holder's lease is live. A claim by the same Locker
// while its lease is live succeeds with a greater fence, and the previous
// Lease is then lost. The lease is extended in the background until Unlock,
// loss or Close. Claim uses ctx as given (Lock adds the Locker's timeout) and
// returns within about two seconds of its end; a claim whose outcome is
// unknown is expired again on the fence it drew. See docs/GUIDE.md,
// "Locker.Claim".
func (l *Locker) Claim(ctx context.Context, key string) (*Lease, error) {
	mustContext(ctx, "Claim")
	return l.claim(ctx, key, l.terms(), reentrant)
}

// claimMode is what a claim does with a live lease of its own Locker on
// the key.
type claimMode int

const (
	reentrant claimMode = iota // takes it over with a greater fence (Claim, Lock)
	exclusive                  // counts it held (heldHereError): an attempt of a waiting claim
)

// claim is Claim of a lease on the given terms, the Locker's or a job's,
// in mode. Every claim whose statement may have reached the server leaves
// through settle, which ends what the statement superseded.
func (l *Locker) claim(ctx context.Context, key string, t terms, mode claimMode) (*Lease, error) {
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("pglease: claim %q: %w", shorten(key), err)
	}
	ctx, leave, err := l.inFlight.Enter(ctx, key)
	if err != nil {
		err = fmt.Errorf("pglease: claim %q: %w", key, err)
		l.emit(Event{Kind: EventClaimFailed, Key: key, Err: err, Context: ctx})
		return nil, err
	}
	defer leave()
	if t.ticks != nil {
		mode = exclusive // a run that outlasts its period keeps its lease
	}
	if err := l.checkTable(ctx); err != nil { // at most once per tableRecheck (table.go)
		err = fmt.Errorf("pglease: claim %q: %w", key, err)
		l.emit(Event{Kind: EventClaimFailed, Key: key, Err: err, Context: ctx})
		return nil, err
	}

	done, err := l.turns.Take(ctx, key)
	if err != nil {
		err = fmt.Errorf("pglease: claim %q: waiting for this Locker's claim of the same key in flight: %w", key, context.Cause(ctx))
		l.emit(Event{Kind: EventClaimFailed, Key: key, Err: err, Context: ctx})
		return nil, err
	}
	defer func() { done() }() // after register: the next claim of key commits after this one
	if mode == exclusive {
		// Asked in the key's turn, so that no claim of this Locker
		// registers a lease of key between.
		if err := l.ownLease(key); err != nil {
			if t.ticks != nil {
				return nil, fmt.Errorf("pglease: claim %q: tick skipped: the run of an earlier tick still holds the key: %w", key, err)
			}
			return nil, fmt.Errorf("pglease: claim %q: %w", key, err)
		}
	}
	known, drawn := l.knownFence(key), l.drawn.Load()
	s := l.sendClaim(ctx, key, t, known, &done)
	return l.settle(ctx, key, t, known, drawn, s)
}

// sawDrawn records fence, drawn by a claim of this Locker.
func (l *Locker) sawDrawn(fence int64) {
	for {
		was := l.drawn.Load()
		if fence <= was || l.drawn.CompareAndSwap(was, fence) {
			return
		}
	}
}

// drewBackwards is the error of a claim that drew fence though a claim of
// this Locker answered before it was sent had drawn drawn, no smaller:
// the fence sequence went backwards under the running Locker (the table
// and its sequence restored from a dump, or dropped and created again),
// and fences already issued are being issued again.
func (l *Locker) drewBackwards(fence, drawn int64) error {
	t, _ := parseTable(l.cfg.table) // checked by newConfig
	return fmt.Errorf("the fence sequence went backwards: fence %d drawn after this Locker's claims drew %d "+
		"(the lease table or its sequence was restored or created again while replicas ran): stop the replicas, "+
		"then set the sequence above every fence issued, as in SELECT setval('%s', %d + 1000000)", fence, drawn, t.seq.Sanitize(), drawn)
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
func (l *Locker) settle(ctx context.Context, key string, t terms, known, drawn int64, s sent) (*Lease, error) {
	took := time.Since(s.at)
	fail := func(kind EventKind, fence int64, err error) (*Lease, error) {
		if cause := context.Cause(ctx); errors.Is(cause, ErrClosed) && !errors.Is(err, ErrClosed) {
			err = fmt.Errorf("%w: %w", err, cause) // Close ended the claim
		}
		err = fmt.Errorf("pglease: claim %q: %w", key, err)
		e := Event{Kind: kind, Key: key, Fence: fence, Err: err, Took: took, Context: ctx}
		var th *tickHeldError
		if errors.As(err, &th) {
			e.Tick, e.Skipped = th.tick, th.skipped()
		}
		l.emit(e)
		return nil, err
	}
	switch {
	case s.err != nil && s.fate == unknown:
		l.supersede(key, "re-claimed by the same holder in a claim whose outcome is unknown")
		l.giveBackUnknown(ctx, key, t, known)
		return fail(EventClaimFailed, 0, withCause(ctx, s.err))
	case s.err != nil: // nothing was written, or the coalescer settles it
		return fail(EventClaimFailed, 0, withCause(ctx, s.err))
	case !s.ok && s.tick != nil:
		return fail(EventContended, 0, &tickHeldError{tick: s.tick.Tick, rowTick: s.tick.RowTick, holder: s.tick.Holder,
			fence: s.tick.Fence, live: s.tick.Live, released: s.tick.Released, run: s.tick.IsRun})
	case !s.ok:
		return fail(EventContended, 0, ErrHeld)
	case !s.c.Live:
		// The claim waited on the row lock past its own expiry. The row
		// carries our holder but is already expired: it is nobody's lease.
		// It also has a new fence: the previous lease is over.
		l.supersede(key, "re-claimed by the same holder")
		l.fences.See(key, s.c.Fence, time.Now(), t.ttl+t.minHold)
		l.sawDrawn(s.c.Fence)
		return fail(EventClaimFailed, s.c.Fence, fmt.Errorf("expired while waiting on the row lock for %v: %w", took, ErrLost))
	case !l.cfg.noFence && s.c.Fence <= drawn:
		// A fence this Locker drew before may be another lease's now, or
		// a fenced store's: the row is given back, on exactly its fence.
		l.supersede(key, "re-claimed by the same holder")
		l.giveBack(ctx, &Lease{key: key, holder: s.c.Holder, fence: s.c.Fence, acquiredAt: s.c.AcquiredAt, terms: t})
		return fail(EventClaimFailed, s.c.Fence, l.drewBackwards(s.c.Fence, drawn))
	}
	l.sawDrawn(s.c.Fence)
	trustUntil := l.trustDeadline(s.at, t.ttl)
	if trustUntil.Left(time.Now()) <= 0 {
		// Live on the server, but the round trip ate the whole trust
		// window: the Locker could not vouch for it for a moment. Its row
		// is given back, on exactly its fence.
		l.supersede(key, "re-claimed by the same holder")
		l.fences.See(key, s.c.Fence, time.Now(), t.ttl+t.minHold)
		l.giveBack(ctx, &Lease{key: key, holder: s.c.Holder, fence: s.c.Fence, acquiredAt: s.c.AcquiredAt, terms: t})
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
		done:       make(chan struct{}),
	}
	// Reported before the lease becomes visible to the heartbeat and Close,
	// so that its end can never be reported before its start.
	skew := l.recordSkew(s.c.AcquiredAt, s.at, took)
	l.emit(Event{Kind: EventAcquired, Key: key, Holder: s.c.Holder, Fence: s.c.Fence, Took: took, Skew: skew, Context: ctx,
		Tick: tickOf(s), CaughtUp: t.ticks != nil && !t.ticks.catchUp.IsZero()})
	prev, err := l.register(lease)
	if err != nil {
		// Close ran while the claim was in flight: give the row back (the
		// release is reported like any other).
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), t.timeout)
		_ = l.release(rctx, lease, ErrClosed)
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

// withCause is err, the failure of a claim statement, wrapping the cause
// of ctx when ctx has ended and err does not say so already: a statement
// shared by a burst fails with its own context's error once every caller
// has given up, and each caller must see its own.
func withCause(ctx context.Context, err error) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(err, cause) {
		return fmt.Errorf("%w: %w", err, cause)
	}
	return err
}

// supersede ends the Locker's lease of key, if it has one, after a claim
// statement may have written the row for this holder without handing out a
// lease: the row has a new fence, so the previous mandate is over.
func (l *Locker) supersede(key, why string) {
	l.mu.Lock()
	prev := l.leases[key]
	l.mu.Unlock()
	if prev != nil {
		prev.lose(why)
	}
}

// knownFence is the greatest fence of key this Locker has been handed and
// may still have a live row under: its lease's, or one it remembers
// (Locker.fences). A live row of this holder with a greater fence was
// written by a claim of this Locker whose reply it never read.
func (l *Locker) knownFence(key string) int64 {
	l.mu.Lock()
	lease := l.leases[key]
	l.mu.Unlock()
	known := l.fences.Greatest(key, time.Now())
	if lease != nil {
		known = max(known, lease.fence)
	}
	return known
}
