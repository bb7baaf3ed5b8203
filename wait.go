package pglease

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

const (
	// minWaitBackoff is the first pause of a waiting claim after ErrHeld.
	minWaitBackoff = 10 * time.Millisecond
	// maxPollBackoff caps the pause while waiters poll: the latency of a
	// wake-up without notifications, against one claim and one read per
	// pause and waiting Locker.
	maxPollBackoff = 250 * time.Millisecond
	// maxNotifyBackoff caps the pause while notifications arrive: a safety
	// net for releases that notify nobody (a table named another way, an
	// older release, a row deleted by hand).
	maxNotifyBackoff = 5 * time.Second
	// expiryMargin is added to the holder's remaining time: the local timer
	// may run a little fast against the server's clock.
	expiryMargin = time.Millisecond
)

// remainingSQL reads who holds a key and for how long still, both on the
// server: expires_at - clock_timestamp(), never compared with the local
// wall clock. Only a waiting claim sends it, after ErrHeld, so that it wakes
// at the holder's expiry (a lapsed or revoked lease notifies nobody) and
// after a min hold. No row: purged or never claimed, try again at once.
const remainingSQL = `SELECT holder, extract(epoch FROM expires_at - clock_timestamp())::float8
  FROM {table} WHERE key = $1`

// waiting holds a Locker's waiting claims and its listener.
type waiting struct {
	table table // for the channel and remainingSQL

	mu      sync.Mutex
	groups  map[string]*waitGroup // keys with a waiting claim
	stopped chan struct{}         // closed by Close
	closed  bool
	mode    WaitMode
	reason  string
	pid     uint32 // the listening connection's backend, for tests
	// releasing holds, per key, the release of this Locker in flight.
	releasing map[string]releaseInFlight
	stop      context.CancelFunc // stops the listener; nil until started
	done      chan struct{}      // closed when the listener returns
}

// waitGroup is the waiting claims of one key in one Locker. One of them at
// a time (the holder of turn) claims and sleeps; the others wait for the
// turn. A release so wakes one claim statement per Locker, not one per
// waiter, and a waiter that wins leaves the others waiting on its lease.
type waitGroup struct {
	turn  chan struct{} // holds a value while a waiter claims for the group
	wake  chan struct{} // a notification or (re)LISTEN since the last claim
	users int           // guarded by waiting.mu
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
		g = &waitGroup{turn: make(chan struct{}, 1), wake: make(chan struct{}, 1)}
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

// wakeAll makes every waiter try once.
func (w *waiting) wakeAll() {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, g := range w.groups {
		signal(g.wake)
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

// startListener starts the listener at the first waiting claim, on a pool
// only: a *pgx.Conn is shared with the heartbeat, and a wrapper may not be
// able to LISTEN, so those poll.
func (l *Locker) startListener() {
	w := &l.waits
	w.mu.Lock()
	if w.closed || w.mode != WaitIdle {
		w.mu.Unlock()
		return
	}
	if l.conns.pool == nil {
		w.mu.Unlock()
		l.setWaitMode(WaitByPolling, fmt.Sprintf("the DB is a %T, not a *pgxpool.Pool: no connection of its own to LISTEN on", l.conns.db))
		return
	}
	w.mode, w.reason = WaitByPolling, "LISTEN not established yet"
	ctx, stop := context.WithCancel(context.Background())
	w.stop, w.done = stop, make(chan struct{})
	go l.listen(ctx, w.done)
	w.mu.Unlock()
}

// stopWaiting ends every waiting claim with ErrClosed and stops the
// listener; Close calls it first.
func (l *Locker) stopWaiting() {
	w := &l.waits
	w.mu.Lock()
	if !w.closed {
		w.closed = true
		close(w.stopCh())
	}
	stop, done := w.stop, w.done
	w.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}

func (w *waiting) byNotification() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode == WaitByNotification
}

// exclusiveClaim marks the context of a waiting claim's attempts: Claim
// then treats a live lease of its own Locker on the key as held (heldHereError)
// instead of taking it over as a re-entrant claim.
type exclusiveClaim struct{}

// heldHereError is ErrHeld by a lease of the claiming Locker itself, live or
// being released; ended is closed once it is gone.
type heldHereError struct{ ended <-chan struct{} }

func (h heldHereError) Error() string { return "held by a lease of this Locker" }
func (h heldHereError) Unwrap() error { return ErrHeld }

// ownLease is the live lease of this Locker on key that the claim of ctx
// must not take over, if ctx is a waiting claim's; nil otherwise. Claim
// asks it in the key's turn, so no claim of this Locker registers between.
func (l *Locker) ownLease(ctx context.Context, key string) error {
	if ctx.Value(exclusiveClaim{}) == nil {
		return nil
	}
	if ls, ok := l.Held(key); ok {
		return heldHereError{ls.Done()}
	}
	l.waits.mu.Lock()
	defer l.waits.mu.Unlock()
	if r, ok := l.waits.releasing[key]; ok {
		return heldHereError{r.done}
	}
	return nil
}

// ClaimWait claims key, and while another holder has it, waits and tries
// again until it gets the lease, ctx ends, or the Locker is closed. It
// returns the same *Lease as Claim. A waiting claim never takes over a live
// lease of its own Locker (Claim would, as a re-entrant claim): waiters of
// one Locker take the key one after the other, like a mutex.
//
// It wakes when the key is released (the release statement notifies the
// table's channel, which the Locker LISTENs on with one connection of its
// pool from the first waiting claim until Close), when the holder's lease
// expires on the server's clock (a lapsed lease notifies nobody), and at a
// backoff with jitter: 10ms doubling up to 250ms when notifications do not
// arrive (WaitMode says why), 5s when they do. The waiters of one key in one
// Locker send one claim at a time between them.
//
// When ctx ends, the error wraps ctx.Err(), and ErrHeld if the key was held
// at the last attempt. Another failure than contention is returned at once.
// A claim that succeeded as ctx ended is returned, never left behind; one
// cancelled in flight is given back by Claim.
func (l *Locker) ClaimWait(ctx context.Context, key string) (*Lease, error) {
	mustContext(ctx, "ClaimWait")
	if err := checkKey(key); err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", shorten(key), err)
	}
	return l.claimWait(ctx, key, waitHooks{})
}

// waitHooks let the Elector's campaign steer a waiting claim.
type waitHooks struct {
	kick    <-chan struct{}                // try again at once
	begin   func()                         // an attempt begins
	held    func(holder string, err error) // each failed attempt; holder of the row when known
	attempt time.Duration                  // bound of each attempt; 0: ctx alone
}

func (l *Locker) claimWait(ctx context.Context, key string, h waitHooks) (*Lease, error) {
	g, stopped, err := l.waits.join(key)
	if err != nil {
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, err)
	}
	defer l.waits.leave(key, g)
	l.startListener()

	select {
	case g.turn <- struct{}{}:
	case <-ctx.Done():
		return nil, fmt.Errorf("pglease: claim wait %q: waiting behind this Locker's other waiters: %w", key, ctx.Err())
	case <-stopped:
		return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
	}
	defer func() { <-g.turn }()

	backoff := minWaitBackoff
	xctx := context.WithValue(ctx, exclusiveClaim{}, true)
	for {
		drain(g.wake)
		if h.kick != nil {
			drain(h.kick)
		}
		if h.begin != nil {
			h.begin()
		}
		lease, err := l.attempt(xctx, key, h.attempt)
		if err == nil {
			return lease, nil
		}
		if !errors.Is(err, ErrHeld) {
			if h.held != nil {
				h.held("", err)
			}
			if !errors.Is(err, ErrClosed) {
				// The claim may have committed a row though it handed out
				// no lease: its context ended in flight, its reply was
				// lost, or it outwaited its trust window on a row lock.
				// A waiter that fails holds nothing. (Close gives back
				// what a claim it overtook committed.)
				l.giveBack(ctx, key)
			}
			if ctx.Err() != nil {
				return nil, fmt.Errorf("pglease: claim wait %q: %w", key, errors.Join(err, ctx.Err()))
			}
			if !errors.Is(err, ErrLost) {
				return nil, err
			}
			// The row came back expired, or too late to trust: nothing
			// failed but time. Wait and try again, as after contention.
		}
		held := err

		var own <-chan struct{}
		// Jitter spreads out the waiters of several Lockers. While
		// notifications arrive, the pause is only a safety net.
		if l.waits.byNotification() {
			backoff = maxNotifyBackoff
		}
		pause := backoff/2 + rand.N(backoff/2+1)
		var here heldHereError
		if errors.As(err, &here) {
			own = here.ended // ends locally: no notification needed
			pause = maxNotifyBackoff
		} else {
			holder, left, rerr := l.remaining(ctx, key)
			switch {
			case rerr == nil:
				pause = min(pause, max(left+expiryMargin, 0))
			case errors.Is(rerr, pgx.ErrNoRows):
				pause = 0
			}
			if h.held != nil {
				h.held(holder, err)
			}
		}
		backoff = min(2*backoff, maxPollBackoff)

		timer := time.NewTimer(pause)
		select {
		case <-g.wake:
		case <-own:
		case <-h.kick:
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, errors.Join(held, ctx.Err()))
		case <-stopped:
			timer.Stop()
			return nil, fmt.Errorf("pglease: claim wait %q: %w", key, ErrClosed)
		}
		timer.Stop()
	}
}

// giveBackSQL expires the live row of key that carries this Locker's holder
// and that no lease of the Locker stands for: a claim whose context ended
// while its statement was in flight may have committed with nobody to hold
// it. Sent in the key's turn, with no lease of the Locker on key live or
// being released, so it cannot touch a mandate the Locker believes in. It
// notifies like a release, for the waiters of other Lockers.
//
//   - It touches only a row as a claim of the Locker's TTL ($3) left it
//     (expires_at = acquired_at + TTL, both from one clock reading): a row a
//     release already expired, or kept for its min hold, is not a claim
//     nobody holds, and is left as it is.
//   - It keeps the longest min hold of the Locker and its jobs ($4): a
//     release of that claim would keep the Locker's, so that a replica
//     whose scheduler fires a little later does not get the tick the claim
//     took; and a job's released row whose min hold equals the Locker's
//     TTL looks like such a claim, and must keep the job's.
const giveBackSQL = `UPDATE {table}
   SET expires_at = GREATEST(clock_timestamp(),
                             acquired_at + make_interval(secs => $4),
                             acquired_at + interval '1 microsecond')
 WHERE key = $1 AND holder = $2 COLLATE "C" AND expires_at > clock_timestamp()
   AND expires_at = acquired_at + make_interval(secs => $3)
RETURNING pg_notify({chanlit}, key)`

// giveBack makes sure a waiting claim that gives up holds no row: it waits,
// within the Locker's timeout, until a claim of key whose caller gave up
// in flight has given its row back (orphanClaim holds the key's turn until
// then), and expires a row a cancelled claim committed unseen. Without a
// fence column each mandate has a holder of its own, unknown here: such a
// row lapses at its expiry.
func (l *Locker) giveBack(ctx context.Context, key string) {
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.timeout)
	defer cancel()
	done, err := l.turns.take(tctx, key)
	if err != nil {
		return
	}
	defer done()
	if l.cfg.noFence || l.ownLease(context.WithValue(ctx, exclusiveClaim{}, true), key) != nil {
		return
	}
	rows, err := l.conns.release.Query(tctx, l.waits.table.render(giveBackSQL), key, l.cfg.holder,
		l.cfg.ttl.Seconds(), time.Duration(l.maxMinHold.Load()).Seconds())
	if err == nil {
		rows.Close()
	}
}

// attempt is one claim of a waiting claim, within bound if positive.
func (l *Locker) attempt(ctx context.Context, key string, bound time.Duration) (*Lease, error) {
	if bound > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, bound)
		defer cancel()
	}
	return l.Claim(ctx, key)
}

// remaining reads the holder of key and the time its lease has left, on the
// server's clock.
func (l *Locker) remaining(ctx context.Context, key string) (string, time.Duration, error) {
	var (
		holder string
		secs   float64
	)
	err := l.conns.claim.QueryRow(ctx, l.waits.remainingSQL(), key).Scan(&holder, &secs)
	if err != nil {
		return "", 0, err
	}
	return holder, time.Duration(secs * float64(time.Second)), nil
}

func (w *waiting) remainingSQL() string { return w.table.render(remainingSQL) }

// releaseStarted records a release on its way: until it has finished, a
// waiting claim of this Locker would take the row over from it (same
// holder), and the release would report ErrLost.
func (w *waiting) releaseStarted(ls *Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.releasing == nil {
		w.releasing = make(map[string]releaseInFlight)
	}
	w.releasing[ls.key] = releaseInFlight{ls, make(chan struct{})}
}

// releaseFinished wakes the waiting claims that wait for ls's release.
func (w *waiting) releaseFinished(ls *Lease) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if r, ok := w.releasing[ls.key]; ok && r.ls == ls {
		close(r.done)
		delete(w.releasing, ls.key)
	}
}

type releaseInFlight struct {
	ls   *Lease
	done chan struct{}
}
