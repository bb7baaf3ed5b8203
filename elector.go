package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/serial"
	"github.com/pglease/pglease/internal/waiters"

	"github.com/pglease/pglease/internal/sqlstmt"
)

var _ gocron.Elector = (*Elector)(nil)

// Elector elects one leader among the replicas of a service, for
// gocron.WithDistributedElector: only the leader runs jobs. Leadership is a
// lease on one key, kept by its Locker's heartbeat; a follower takes over
// within a round trip of the leader's Close. See docs/GUIDE.md, "Elector".
type Elector struct {
	locker *Locker
	key    string
	terms  terms
	cb     LeaderCallbacks

	kick    chan struct{} // IsLeader asks the campaign to try at once
	closing chan struct{} // closed by Close
	queued  chan struct{} // closed once the first Close has queued the last callbacks

	mu        sync.Mutex
	lease     *Lease             // the current lease, or nil
	leader    string             // the last leader seen
	lastErr   error              // the outcome of the campaign's last failed attempt
	begun     int                // attempts of the campaign begun
	ended     int                // and ended
	attempted chan struct{}      // closed and replaced after each attempt
	closed    atomic.Bool        // set by Close, under mu; read without it by isClosed
	stop      context.CancelFunc // stops the campaign; nil until started
	done      chan struct{}      // closed when the campaign returns
	calls     serial.Queue       // the callbacks, in order, taken under mu
}

// LeaderCallbacks are called as an Elector's leadership changes. Each may be
// nil. They run one at a time, in order, on a goroutine of the Elector; they
// may call the Elector (Close too) and should return promptly.
type LeaderCallbacks struct {
	// OnStartedLeading: this replica became the leader with lease. Its
	// Done or Context ends when leadership does.
	OnStartedLeading func(lease *Lease)
	// OnStoppedLeading: the lease of OnStartedLeading ended (Close
	// resigned, or it was lost); lease.Err says which.
	OnStoppedLeading func(lease *Lease)
	// OnNewLeader: the leader changed to holder (this replica's own when it
	// was elected), as a follower sees it.
	OnNewLeader func(holder string)
}

// WithLeaderCallbacks sets the callbacks of an Elector.
func WithLeaderCallbacks(cb LeaderCallbacks) Option {
	return Option{"WithLeaderCallbacks", atElector, "only an Elector leads: give it to NewElector", func(c *config) { c.leaderCallbacks = cb }}
}

// campaignRetry is the pause of the campaign after an attempt that failed
// for another reason than contention (database down): IsLeader cuts it
// short.
const campaignRetry = time.Second

// NewElector returns an Elector of l for key, the same on every replica. It
// claims with l's holder, on terms of its own (WithTTL, WithTimeout; by
// default l's) and no min hold; l.Close closes it first. It sends nothing to
// the database.
func NewElector(l *Locker, key string, opts ...Option) (*Elector, error) {
	if l == nil {
		return nil, errors.New("pglease: new elector: locker is nil")
	}
	if err := keys.Check(key); err != nil {
		return nil, fmt.Errorf("pglease: new elector %q: %w", keys.Short(key), err)
	}
	t := l.terms()
	c := config{ttl: t.ttl, timeout: t.timeout} // no min hold
	c.apply(atElector, opts)
	t, err := l.ownTerms("NewElector", c)
	if err != nil {
		return nil, err
	}
	e := &Elector{
		locker:    l,
		key:       key,
		terms:     t,
		cb:        c.leaderCallbacks,
		kick:      make(chan struct{}, 1),
		closing:   make(chan struct{}),
		queued:    make(chan struct{}),
		attempted: make(chan struct{}),
	}
	if err := l.reg.addElector(e, key); err != nil {
		return nil, fmt.Errorf("pglease: new elector %q: %w", key, err)
	}
	return e, nil
}

// isClosed reports whether Close has begun; it takes no lock, so that the
// registry may ask it under its own (registry.addElector).
func (e *Elector) isClosed() bool { return e.closed.Load() }

// Key is the leader key the Elector claims.
func (e *Elector) Key() string { return e.key }

// IsLeader implements gocron.Elector: nil while this replica leads, an error
// wrapping ErrHeld while another does. While the leadership lease is trusted
// it answers without a round trip. The first call starts the campaign.
func (e *Elector) IsLeader(ctx context.Context) error {
	mustContext(ctx, "IsLeader")
	ctx, cancel := context.WithTimeout(ctx, e.terms.timeout)
	defer cancel()
	if _, err := e.next(ctx, true); err != nil {
		return fmt.Errorf("pglease: is leader: %w", err)
	}
	return nil
}

// Campaign waits until this replica leads (outside gocron) and returns the
// leadership lease, held until its Done. Its error wraps ctx.Err() when ctx
// ends (and ErrHeld once an attempt found the key held), ErrClosed once the
// Elector or Locker is closed; others return at once (GUIDE "Elector.Campaign").
func (e *Elector) Campaign(ctx context.Context) (*Lease, error) {
	mustContext(ctx, "Campaign")
	for {
		lease, err := e.next(ctx, false)
		if err == nil {
			return lease, nil
		}
		if !errors.Is(err, ErrHeld) || ctx.Err() != nil {
			return nil, fmt.Errorf("pglease: campaign: %w", err)
		}
	}
}

// next returns the live leadership lease, or waits for the outcome of an
// attempt of the campaign that begins after this call (asking for one at
// once if kick): an attempt already in flight may predate a release.
func (e *Elector) next(ctx context.Context, kick bool) (*Lease, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.closed.Load() {
		return nil, ErrClosed
	}
	e.startLocked()
	target := e.begun + 1
	if kick {
		waiters.Signal(e.kick)
	}
	for {
		switch {
		case e.lease != nil && e.lease.Err() == nil:
			return e.lease, nil
		case e.ended >= target:
			switch {
			case e.lastErr != nil:
				return nil, e.lastErr
			case e.lease != nil && e.lease.Err() != nil:
				// Won, and ended before this call could return it (a
				// callback closed the Locker, the row was taken): say how.
				return nil, fmt.Errorf("leadership ended at once: %w", e.lease.Err())
			case e.closed.Load(): // Close resigned it, and forgot it, first
				return nil, fmt.Errorf("leadership ended at once: %w", ErrClosed)
			}
			return nil, fmt.Errorf("leadership ended at once: %w", ErrLost)
		}
		attempted := e.attempted
		e.mu.Unlock()
		select {
		case <-attempted:
			e.mu.Lock()
		case <-e.closing:
			e.mu.Lock()
			return nil, ErrClosed
		case <-ctx.Done():
			e.mu.Lock()
			return nil, errors.Join(e.lastErr, ctx.Err())
		}
	}
}

// startLocked starts the campaign and the callbacks' goroutine; e.mu is
// held.
func (e *Elector) startLocked() {
	if e.stop != nil {
		return
	}
	ctx, stop := context.WithCancel(context.Background())
	e.stop, e.done = stop, make(chan struct{})
	go e.campaign(ctx)
	e.calls.Start()
}

// campaign waits for the leader key and claims it, then watches the lease
// until it ends, and starts over; until Close.
func (e *Elector) campaign(ctx context.Context) {
	defer close(e.done)
	// In flight for its whole life: what an attempt leaves behind is
	// Close's to name (Locker.Close closes the Electors once it has begun).
	ctx, call, err := e.locker.inFlight.Enter(ctx, e.key)
	if err != nil {
		return
	}
	defer call.Leave()
	hooks := waitHooks{kick: e.kick, begin: e.begin, held: e.failed, terms: &e.terms}
	for ctx.Err() == nil {
		lease, err := e.locker.claimWait(ctx, e.key, hooks, call)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return
			}
			select { // failures are reported by the Locker's claim events
			case <-ctx.Done():
				return
			case <-e.kick:
			case <-time.After(campaignRetry):
			}
			continue
		}
		e.elected(lease)
		select {
		case <-lease.Done():
			e.stopped(lease)
		case <-ctx.Done():
			return // Close releases the lease and reports it stopped
		}
	}
}

func (e *Elector) begin() {
	e.mu.Lock()
	e.begun++
	e.mu.Unlock()
}

// failed records an attempt of the campaign that did not get the key, and
// the leader it saw. A revoked key (its holder the revoke marker) has no leader: nothing is
// reported, and the next real holder, whoever it is, is reported as the new
// leader.
func (e *Elector) failed(holder string, err error) {
	e.mu.Lock()
	if e.closed.Load() && !errors.Is(err, ErrClosed) { // Close marks e closed, then stops the campaign: its cut attempt is Close's
		err = fmt.Errorf("%w (the campaign's last attempt: %w)", ErrClosed, err)
	}
	e.lastErr, e.ended = err, e.begun
	close(e.attempted)
	e.attempted = make(chan struct{})
	if holder == sqlstmt.RevokedHolder {
		holder, e.leader = "", ""
	}
	changed := holder != "" && holder != e.leader
	if changed {
		e.leader = holder
		e.queueNewLeaderLocked(holder)
	}
	e.mu.Unlock()
	if changed {
		e.locker.cfg.emit(Event{Kind: EventNewLeader, Key: e.key, Holder: holder})
	}
}

// elected makes lease the leadership. It is reported before Campaign or
// IsLeader can return it, as a claim is, so that a hook never sees a
// leadership that has not begun.
func (e *Elector) elected(lease *Lease) {
	e.locker.cfg.emit(Event{Kind: EventElected, Key: e.key, Holder: lease.Holder(), Fence: lease.Fence()})
	e.mu.Lock()
	e.lease, e.lastErr, e.ended = lease, nil, e.begun
	close(e.attempted)
	e.attempted = make(chan struct{})
	newLeader := lease.Holder() != e.leader
	e.leader = lease.Holder()
	if newLeader {
		e.queueNewLeaderLocked(lease.Holder())
	}
	if f := e.cb.OnStartedLeading; f != nil {
		e.calls.Push(func() { f(lease) })
	}
	e.mu.Unlock()
	if newLeader {
		e.locker.cfg.emit(Event{Kind: EventNewLeader, Key: e.key, Holder: lease.Holder()})
	}
}

// stopped reports the end of lease, once.
func (e *Elector) stopped(lease *Lease) {
	e.mu.Lock()
	if e.lease != lease {
		e.mu.Unlock()
		return
	}
	e.lease = nil
	if f := e.cb.OnStoppedLeading; f != nil {
		e.calls.Push(func() { f(lease) })
	}
	e.mu.Unlock()
	e.locker.cfg.emit(Event{Kind: EventStoppedLeading, Key: e.key, Holder: lease.Holder(), Fence: lease.Fence(), Err: lease.Err()})
}

// queueNewLeaderLocked queues OnNewLeader(holder), if set; e.mu is held.
func (e *Elector) queueNewLeaderLocked(holder string) {
	if f := e.cb.OnNewLeader; f != nil {
		e.calls.Push(func() { f(holder) })
	}
}

// Leader returns this replica's leadership lease while it leads: its fence
// orders the leases of successive leaders.
func (e *Elector) Leader() (*Lease, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease == nil || e.lease.Err() != nil {
		return nil, false
	}
	return e.lease, true
}

// Close resigns: the campaign stops and the leadership lease is released at
// once, even if ctx is cancelled, so that a follower takes over within a
// round trip; the callbacks still due run first. The Locker stays open.
// Close is idempotent. See docs/GUIDE.md, "Elector.Close".
func (e *Elector) Close(ctx context.Context) error {
	mustContext(ctx, "Elector.Close") // before anything changes
	e.mu.Lock()
	first := !e.closed.Swap(true)
	stop, done := e.stop, e.done
	e.mu.Unlock()
	fromCallback := e.calls.Calling()
	if !first {
		select {
		case <-e.queued:
		case <-ctx.Done():
			return fmt.Errorf("pglease: Elector.Close: waiting for the first Close: %w", ctx.Err())
		}
		return e.finish(ctx, fromCallback)
	}
	close(e.closing)
	if stop != nil {
		stop()
		<-done
	}
	var err error
	e.mu.Lock()
	lease := e.lease
	e.mu.Unlock()
	if lease != nil {
		// Released as the Locker's Close releases: its Err wraps ErrClosed.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.terms.timeout)
		err = resigned(e.locker.release(rctx, lease, ErrClosed))
		cancel()
		e.stopped(lease)
	}
	e.calls.Close() // the last callbacks are queued
	close(e.queued)
	return errors.Join(err, e.finish(ctx, fromCallback))
}

// finish waits until the callbacks' goroutine has run every callback
// queued and returned, and has the Locker forget e; unless Close was
// called from a callback (fromCallback): it runs on that very goroutine,
// which goes on once the callback returns, and the Locker's Close then
// waits for the callbacks still due, as a later Elector.Close would. It
// waits for the timeout, and beyond it as long as ctx lasts: a callback
// that waits for another Close cannot hold this one up for ever.
func (e *Elector) finish(ctx context.Context, fromCallback bool) error {
	if fromCallback {
		return nil
	}
	bound, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.terms.timeout)
	defer cancel()
	if e.calls.Wait(bound) != nil && e.calls.Wait(ctx) != nil {
		return fmt.Errorf("pglease: Elector.Close: waiting for the callbacks still due, beyond %v: %w", e.terms.timeout, ctx.Err())
	}
	e.locker.reg.dropElector(e)
	return nil
}

// resigned is what Close returns for the Locker's Close error err.
func resigned(err error) error {
	if errors.Is(err, ErrLost) {
		return nil // it was no longer leading: nothing to hand over
	}
	return err
}
