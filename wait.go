package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/flight"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/poll"
	"github.com/pglease/pglease/internal/waiters"
)

const (
	// minWaitBackoff is the first pause of a waiting claim after ErrHeld.
	minWaitBackoff = 10 * time.Millisecond
	// maxNotifyBackoff caps the pause while notifications arrive: a safety
	// net for releases that notify nobody (a table named another way, an
	// older release, a row deleted by hand).
	maxNotifyBackoff = 5 * time.Second
	// expiryMargin is added to the holder's remaining time: the local timer
	// may run a little fast against the server's clock.
	expiryMargin = time.Millisecond
)

// newSchedule is the pauses of one waiting claim (internal/poll): while
// polling, 10ms doubling up to maxPollInterval, lengthened by up to a
// quarter; while notified, maxNotifyBackoff less up to half; at most until
// the holder's expiry.
func newSchedule() *poll.Schedule {
	return &poll.Schedule{
		Min: minWaitBackoff, Max: maxPollInterval, Notified: maxNotifyBackoff, Margin: expiryMargin,
		Jitter: func(d time.Duration) time.Duration { return rand.N(d + 1) },
	}
}

// waiting holds a Locker's waiting claims and its listener.
type waiting struct {
	table driver.Table // for the channel and sqlstmt.Remaining
	set   waiters.Set  // the waiting claims, by key

	mu     sync.Mutex // the listener's state
	closed bool
	mode   waitMode
	reason string
	pid    uint32             // the listening connection's backend, for tests
	stop   context.CancelFunc // stops the listener; nil until started
	done   chan struct{}      // closed when the listener returns
}

func (w *waiting) byNotification() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode == waitByNotification
}

// heldHereError is ErrHeld by a lease of the claiming Locker itself, live or
// being released; ended is closed once it is gone.
type heldHereError struct{ ended <-chan struct{} }

func (h heldHereError) Error() string { return "held by a lease of this Locker" }
func (h heldHereError) Unwrap() error { return ErrHeld }

// ownLease is heldHereError for the live lease of this Locker on key, or
// its lease of key being released; nil when there is none.
func (l *Locker) ownLease(key string) error {
	if ls, ok := l.Held(key); ok {
		return heldHereError{ls.Done()}
	}
	if done, ok := l.reg.releaseOf(key); ok {
		return heldHereError{done}
	}
	return nil
}

// ClaimWait claims key, waiting while another holder has it, until it gets
// the lease, ctx ends or the Locker closes; a Locker's waiters take the key
// in turn. When ctx ends its error wraps ctx.Err() (and ErrHeld if the key
// was held); other failures return at once. See docs/GUIDE.md,
// "Locker.ClaimWait".
func (l *Locker) ClaimWait(ctx context.Context, key string) (*Lease, error) {
	mustContext(ctx, "ClaimWait")
	if err := keys.Check(key); err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", keys.Short(key), err)
	}
	return l.claimWait(ctx, key, waitHooks{}, flight.Call{})
}

// waitHooks let the Elector's campaign steer a waiting claim.
type waitHooks struct {
	kick  <-chan struct{}                // try again at once
	begin func()                         // an attempt begins
	held  func(holder string, err error) // each failed attempt; holder of the row when known
	terms *terms                         // the terms of each attempt, its timeout bounding it; nil: the Locker's, ctx alone
}

func (l *Locker) claimWait(ctx context.Context, key string, h waitHooks, parent flight.Call) (*Lease, error) {
	ctx, call, err := l.inFlight.EnterUnder(ctx, key, parent)
	if err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, err)
	}
	defer call.Leave()
	g, err := l.waits.set.Join(key)
	if err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
	}
	defer l.waits.set.Leave(key, g)
	l.startListener()

	switch err := g.Take(ctx); {
	case errors.Is(err, waiters.ErrClosed):
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
	case err != nil:
		return nil, fmt.Errorf("pglease: claim wait %q: waiting behind this Locker's other waiters: %w", key, ended(ctx))
	}
	defer g.Give()

	schedule := newSchedule()
	reached := false // an attempt found the key held: the server answers
	for {
		g.Fresh()
		waiters.Drain(h.kick)
		if h.begin != nil {
			h.begin()
		}
		lease, err := l.attempt(ctx, key, h.terms, call)
		if err == nil {
			return lease, nil
		}
		if !errors.Is(err, ErrHeld) {
			if h.held != nil {
				h.held("", err)
			}
			// A claim that may have committed a row though it handed out
			// no lease (its context ended in flight, its reply was lost,
			// it outwaited its trust window on a row lock) has given that
			// row back before it returned (Locker.settle).
			if ctx.Err() != nil {
				return nil, fmt.Errorf("pglease: claim wait %q: %w", key, errors.Join(err, ended(ctx)))
			}
			if !errors.Is(err, ErrLost) && (!reached || !driver.ServerRestarting(err)) {
				return nil, err
			}
			// The row came back expired or too late to trust (nothing failed
			// but time), or the server this wait has reached ended, refused or
			// could not take the connection as it restarted: the claim did not
			// commit. Wait and try again, as after contention.
		} else {
			reached = true
		}
		held := err

		pause := waiters.Pause{Kick: h.kick}
		var here heldHereError
		if errors.As(err, &here) {
			pause.Own = here.ended // ends locally: no notification needed
			pause.For = maxNotifyBackoff
			if h.held != nil {
				h.held("", err) // a lease of this Locker: no other leader to report
			}
		} else {
			// Jitter spreads out the waiters of several Lockers. While
			// notifications arrive, the pause is only a safety net; while
			// polling, it is at least maxPollInterval once grown.
			// No waiter sleeps longer than maxNotifyBackoff anyway.
			holder, left, rerr := driver.Remaining(ctx, l.conns.Claim(), l.waits.table, key, maxNotifyBackoff)
			known := poll.Unknown
			switch {
			case rerr == nil:
				known = poll.Live
			case errors.Is(rerr, driver.ErrNoLease):
				known = poll.Missing
			}
			pause.Schedule, pause.Read = schedule, time.Now()
			pause.For = schedule.Pause(l.waits.byNotification(), known, left)
			if h.held != nil {
				h.held(holder, err)
			}
		}

		switch err := g.Sleep(ctx, pause); {
		case errors.Is(err, waiters.ErrClosed):
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
		case err != nil:
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, errors.Join(held, ended(ctx)))
		}
	}
}

// catchUp waits for the run of tick, which holds key, to end, and claims
// that tick once more if the run lapsed (WithCatchUp): a waiting claim on
// the job's terms, ended as soon as an attempt finds the run released,
// revoked or followed by a later tick, and at most the job's TTL and
// period after it began. A claim that lost the tick to a claim at the
// same time (raced) waits for the winner's run alike.
func (l *Locker) catchUp(ctx context.Context, key string, t terms, tick time.Time) (*Lease, error) {
	tk := *t.ticks
	tk.catchUp = tick
	ct := t
	ct.ticks = &tk
	ctx, cancel := context.WithTimeout(ctx, t.ttl+max(t.ticks.after(tick), 0))
	defer cancel()
	ctx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	return l.claimWait(ctx, key, waitHooks{terms: &ct, held: func(_ string, err error) {
		var th *tickHeldError
		if errors.As(err, &th) && !th.mayLapse() && !th.raced() {
			stop(th) // run to its end, or no longer the tick's: nothing to catch up
		}
	}}, flight.Call{})
}

// attempt is one claim of a waiting claim (exclusive): on the terms t,
// within their timeout, or on the Locker's within ctx alone when t is nil.
func (l *Locker) attempt(ctx context.Context, key string, t *terms, wait flight.Call) (*Lease, error) {
	if t == nil {
		return l.claim(ctx, key, l.terms(), exclusive, wait)
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	return l.claim(ctx, key, *t, exclusive, wait)
}

// ended is why ctx ended: ctx.Err(), and its cause if that says more (Close
// ends the context of a waiting claim with ErrClosed).
func ended(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(ctx.Err(), cause) {
		return errors.Join(ctx.Err(), cause)
	}
	return ctx.Err()
}
