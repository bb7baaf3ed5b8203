package pglease

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pglease/internal/driver"
)

// Close closes the Locker's Electors, stops the heartbeat, releases every
// lease still held in one statement (their Err then wraps ErrClosed), even
// if ctx is cancelled, ends claims in flight with ErrClosed, and waits for
// the Locker's goroutines. When it returns nil, nothing of the Locker runs
// or is held. It is idempotent. See docs/GUIDE.md, "Locker.Close".
func (l *Locker) Close(ctx context.Context) error {
	mustContext(ctx, "Close")
	electors, first := l.markClosed(ctx)
	if !first {
		select {
		case <-l.closing:
			return nil
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	errs := closeElectors(ctx, electors)
	held := l.stopClaiming()
	// The releases and the waits for what is in flight run even if ctx is
	// cancelled, bounded by the Locker's timeout.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.timeout)
	defer cancel()
	errs = append(errs, l.releaseHeld(rctx, held)...)
	errs = append(errs, l.awaitInFlight(ctx, rctx)...)
	errs = append(errs, l.closeConnections(ctx)...)
	close(l.closing)
	return errors.Join(errs...)
}

// markClosed marks the Locker closed, so that no claim registers a lease
// any more, and hands over its Electors; first is false when an earlier
// Close did it.
func (l *Locker) markClosed(ctx context.Context) (electors map[*Elector]struct{}, first bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, false
	}
	l.closed = true
	l.closeCtx = ctx
	electors, l.electors = l.electors, nil
	return electors, true
}

// closeElectors closes the Locker's Electors first: each resigns, its
// campaign stops and its callbacks run, so that no goroutine of theirs
// outlives the Locker.
func closeElectors(ctx context.Context, electors map[*Elector]struct{}) []error {
	var errs []error
	for e := range electors {
		if err := e.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// stopClaiming ends the claims in flight with ErrClosed (no new one
// starts), makes waiting claims return ErrClosed and stops the listener,
// stops the heartbeat and waits for its round in flight, and returns the
// leases held then.
func (l *Locker) stopClaiming() []*Lease {
	l.mu.Lock()
	stop, loopDone := l.stop, l.loopDone
	held := make([]*Lease, 0, len(l.leases))
	for _, lease := range l.leases {
		held = append(held, lease)
	}
	l.mu.Unlock()
	l.inFlight.Close(ErrClosed)
	l.stopWaiting()
	if stop != nil {
		stop()
		<-loopDone
	}
	return held
}

// releaseHeld releases held together, within rctx; a lease already lost
// is no error of Close's.
func (l *Locker) releaseHeld(rctx context.Context, held []*Lease) []error {
	var errs []error
	for _, err := range l.releaseAll(rctx, held, ErrClosed) {
		if err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errs
}

// awaitInFlight waits for the claims in flight, the Unlocks that began
// before Close and the statements of both coalescers. A claim in flight
// gives back what it may have committed before it returns (settle), on
// these connections; cancelled, each ends by itself (see Close's doc):
// it is waited for within rctx, the Locker's timeout, and beyond it as
// long as ctx lasts. An Unlock that began before Close is left to it
// (releaseAll) and waited for within rctx.
func (l *Locker) awaitInFlight(ctx, rctx context.Context) []error {
	var errs []error
	err := l.inFlight.Wait(rctx)
	if err != nil && ctx.Err() == nil {
		err = l.inFlight.Wait(ctx)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("pglease: close: %w (cancelled, each ends by itself within %v plus its timeout, "+
			"or through lib/pq once the server answers or the connection fails)", err, 2*driver.AnswerGrace))
	}
	for _, done := range l.waits.releasesInFlight() {
		select {
		case <-done:
		case <-rctx.Done():
			errs = append(errs, fmt.Errorf("pglease: close: a release still in flight: %w", context.Cause(rctx)))
		}
	}
	if l.claims != nil { // nil: claims go one by one
		l.claims.Wait()
	}
	if l.releases != nil {
		l.releases.Wait()
	}
	l.mu.Lock()
	errs = append(errs, l.givenUp...)
	l.mu.Unlock()
	return errs
}

// closeConnections stops the watchdog, gives the heartbeat's reserve back
// to the pool and waits, within ctx, for the connections closed after a
// cancel request to finish closing.
func (l *Locker) closeConnections(ctx context.Context) []error {
	l.unwatch()
	l.conns.Close()
	if err := l.conns.Closing.Wait(ctx); err != nil {
		return []error{fmt.Errorf("pglease: close: %w", err)}
	}
	return nil
}
