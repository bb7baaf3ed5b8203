package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/poll"
	"github.com/pglease/pglease/internal/sqlstmt"
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

	mu      sync.Mutex
	groups  map[string]*waitGroup // keys with a waiting claim
	stopped chan struct{}         // closed by Close
	closed  bool
	mode    waitMode
	reason  string
	pid     uint32             // the listening connection's backend, for tests
	stop    context.CancelFunc // stops the listener; nil until started
	done    chan struct{}      // closed when the listener returns
}

// waitGroup is the waiting claims of one key in one Locker. One of them at
// a time (the holder of turn) claims and sleeps; the others wait for the
// turn. A release so wakes one claim statement per Locker, not one per
// waiter, and a waiter that wins leaves the others waiting on its lease.
type waitGroup struct {
	turn   chan struct{} // holds a value while a waiter claims for the group
	wake   chan struct{} // a notification since the last claim
	repoll chan struct{} // notifications stopped since the last claim
	users  int           // guarded by waiting.mu
}

func (w *waiting) stopCh() chan struct{} {
	if w.stopped == nil {
		w.stopped = make(chan struct{})
	}
	return w.stopped
}

// join adds a waiter of key; it returns the key's group and the channel
// Close closes.
func (w *waiting) join(key string) (*waitGroup, <-chan struct{}, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.closed {
		return nil, nil, ErrClosed
	}
	if w.groups == nil {
		w.groups = make(map[string]*waitGroup)
	}
	g := w.groups[key]
	if g == nil {
		g = &waitGroup{turn: make(chan struct{}, 1), wake: make(chan struct{}, 1), repoll: make(chan struct{}, 1)}
		w.groups[key] = g
	}
	g.users++
	return g, w.stopCh(), nil
}

func (w *waiting) leave(key string, g *waitGroup) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g.users--; g.users == 0 {
		delete(w.groups, key)
	}
}

// wake wakes the waiters of key, if any.
func (w *waiting) wake(key string) {
	w.mu.Lock()
	g := w.groups[key]
	w.mu.Unlock()
	if g != nil {
		signal(g.wake)
	}
}

// repollAll tells every waiter that notifications stopped: one asleep on
// the notified safety net polls from then on.
func (w *waiting) repollAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.groups {
		signal(g.repoll)
	}
}

func signal(ch chan struct{}) {
	select {
	case ch <- struct{}{}:
	default:
	}
}

func drain(ch <-chan struct{}) {
	select {
	case <-ch:
	default:
	}
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
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", shorten(key), err)
	}
	return l.claimWait(ctx, key, waitHooks{})
}

// waitHooks let the Elector's campaign steer a waiting claim.
type waitHooks struct {
	kick  <-chan struct{}                // try again at once
	begin func()                         // an attempt begins
	held  func(holder string, err error) // each failed attempt; holder of the row when known
	terms *terms                         // the terms of each attempt, its timeout bounding it; nil: the Locker's, ctx alone
}

func (l *Locker) claimWait(ctx context.Context, key string, h waitHooks) (*Lease, error) {
	ctx, leave, err := l.inFlight.Enter(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, err)
	}
	defer leave()
	g, stopped, err := l.waits.join(key)
	if err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, err)
	}
	defer l.waits.leave(key, g)
	l.startListener()

	select {
	case g.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("pglease: claim wait %q: waiting behind this Locker's other waiters: %w", key, ended(ctx))
	case <-stopped:
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
	}
	defer func() { <-g.turn }()

	schedule := newSchedule()
	reached := false // an attempt found the key held: the server answers
	for {
		drain(g.wake)
		drain(g.repoll)
		if h.kick != nil {
			drain(h.kick)
		}
		if h.begin != nil {
			h.begin()
		}
		lease, err := l.attempt(ctx, key, h.terms)
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
			// The row came back expired, or too late to trust: nothing
			// failed but time. Or the server this wait has reached ended
			// the connection as it shut down, refused it as it started, or
			// could not be connected to: the claim did not commit. Wait and
			// try again, as after contention.
		} else {
			reached = true
		}
		held := err

		var (
			own    <-chan struct{}
			pause  time.Duration
			here   heldHereError
			repoll <-chan struct{} // nil unless the pause is the schedule's
			read   time.Time       // when the pause began
		)
		if errors.As(err, &here) {
			own = here.ended // ends locally: no notification needed
			pause = maxNotifyBackoff
		} else {
			// Jitter spreads out the waiters of several Lockers. While
			// notifications arrive, the pause is only a safety net; while
			// polling, it is at least maxPollInterval once grown.
			holder, left, rerr := l.remaining(ctx, key)
			known := poll.Unknown
			switch {
			case rerr == nil:
				known = poll.Live
			case errors.Is(rerr, pgx.ErrNoRows):
				known = poll.Missing
			}
			read, repoll = time.Now(), g.repoll
			pause = schedule.Pause(l.waits.byNotification(), known, left)
			if h.held != nil {
				h.held(holder, err)
			}
		}

		switch closed, err := sleep(ctx, pause, sleepOn{g.wake, own, h.kick, repoll, stopped}, schedule, read); {
		case closed:
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
		case err != nil:
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, errors.Join(held, err))
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
	}})
}

// sleepOn is what a waiting claim's pause listens to: a notification, the
// end of its own Locker's lease, a kick and Close end it; the switch to
// polling (nil when the pause is not the schedule's) shortens it.
type sleepOn struct {
	wake, own, kick, repoll, stopped <-chan struct{}
}

// sleep pauses a waiting claim for pause, begun at read, or until one of
// on comes first; the switch to polling shortens a notified pause to the
// polling pause the schedule gives from read. It says whether the Locker
// was closed, or why ctx ended.
func sleep(ctx context.Context, pause time.Duration, on sleepOn, schedule *poll.Schedule, read time.Time) (closed bool, err error) {
	timer := time.NewTimer(pause)
	defer timer.Stop()
	for {
		select {
		case <-on.wake:
		case <-on.own:
		case <-on.kick:
		case <-timer.C:
		case <-on.repoll:
			if p, ok := schedule.Repoll(); ok {
				timer.Reset(time.Until(read.Add(p)))
			}
			continue
		case <-ctx.Done():
			return false, ended(ctx)
		case <-on.stopped:
			return true, nil
		}
		return false, nil
	}
}

// attempt is one claim of a waiting claim (exclusive): on the terms t,
// within their timeout, or on the Locker's within ctx alone when t is nil.
func (l *Locker) attempt(ctx context.Context, key string, t *terms) (*Lease, error) {
	if t == nil {
		return l.claim(ctx, key, l.terms(), exclusive)
	}
	ctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	return l.claim(ctx, key, *t, exclusive)
}

// remaining reads the holder of key and the time its lease has left, on the
// server's clock.
func (l *Locker) remaining(ctx context.Context, key string) (string, time.Duration, error) {
	var (
		holder string
		secs   float64
	)
	err := l.conns.Claim().QueryRow(ctx, l.waits.remainingSQL(), key).Scan(&holder, &secs)
	if err != nil {
		return "", 0, err
	}
	// A row pinned far away (an expiry in the year 9999, or infinity) would
	// overflow a Duration into a negative pause: no waiter sleeps longer
	// than maxNotifyBackoff anyway.
	return holder, time.Duration(min(secs, maxNotifyBackoff.Seconds()) * float64(time.Second)), nil
}

func (w *waiting) remainingSQL() string { return w.table.Render(sqlstmt.Remaining) }

// ended is why ctx ended: ctx.Err(), and its cause if that says more (Close
// ends the context of a waiting claim with ErrClosed).
func ended(ctx context.Context) error {
	if cause := context.Cause(ctx); cause != nil && !errors.Is(ctx.Err(), cause) {
		return errors.Join(ctx.Err(), cause)
	}
	return ctx.Err()
}
