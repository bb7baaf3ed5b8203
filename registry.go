package pglease

import (
	"context"
	"errors"
	"maps"
	"slices"
	"sync"
	"time"
)

// registry is what a Locker holds, behind one mutex: the newest unended
// lease of each key, the releases on their way, the greatest fence of each
// key its claims were handed,
// its Electors, the events it reported once, its heartbeat goroutine (which
// the first lease starts), and whether Close has begun. Close marks it
// closed in one step, so that no lease registers, no Elector joins and no
// heartbeat starts once Close has taken what it must end.
//
// Lock order, the one place it is written: registry.mu is taken last.
// Under it nothing else is locked (an Elector's closed state is read
// without its lock); it may be taken with any other lock of the Locker
// held: an Elector's, the watchdog's, the gate of a heartbeat round, a
// Lease's (a release records itself under it).
type registry struct {
	mu     sync.Mutex
	leases map[string]*Lease // the newest unended lease per key
	// releasing holds each release in flight, by lease, its channel made
	// by the first who waits (releaseDone): a key may have two (a lease a
	// re-entrant claim superseded, and its successor), Close waits for both.
	releasing map[*Lease]chan struct{}
	electors  map[*Elector]struct{} // its Electors, until closed with their callbacks run
	warned    map[string]bool       // events reported once per key (Locker.once), by kind and key
	closed    bool
	stopBeat  context.CancelFunc // stops the heartbeat; nil until started
	beatDone  chan struct{}      // closed when the heartbeat goroutine returns
	// closeCtx is Close's context, once Close has begun: a give-back then
	// keeps its values (giveBackContext). givenUp failed, for Close to return.
	closeCtx context.Context
	givenUp  []error
	// giveBackUntil bounds every give-back once Close has begun, when
	// Close's context has ended (giveBackContext).
	giveBackUntil time.Time
	// landing holds the keys of claims whose outcome is unknown and whose
	// rows were not found (mayLand): each may still write one, as long as
	// the Locker runs, so a key stays in it.
	landing map[string]bool
}

// add makes lease the newest of its key, and with the first lease starts
// the heartbeat, beat. It
// returns the lease it replaces, if any, or ErrClosed once Close has begun.
// Claims of one key take turns (Locker.turns), so the lease added last is
// the one committed last: the row's lease, with or without a fence to say
// so.
func (r *registry) add(lease *Lease, beat func(ctx context.Context, done chan<- struct{})) (*Lease, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if r.leases == nil {
		r.leases = make(map[string]*Lease)
	}
	prev := r.leases[lease.key]
	r.leases[lease.key] = lease
	if r.stopBeat == nil {
		ctx, stop := context.WithCancel(context.Background())
		r.stopBeat, r.beatDone = stop, make(chan struct{})
		go beat(ctx, r.beatDone)
	}
	return prev, nil
}

// remove drops lease if it is still the newest of its key.
func (r *registry) remove(lease *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leases[lease.key] == lease {
		delete(r.leases, lease.key)
	}
}

// get is the newest unended lease of key, or nil.
func (r *registry) get(key string) *Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.leases[key]
}

// all lists the leases held now.
func (r *registry) all() []*Lease {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]*Lease, 0, len(r.leases))
	for _, lease := range r.leases {
		out = append(out, lease)
	}
	return out
}

// any reports whether a lease is held and Close has not begun: the
// watchdog sleeps again only then.
func (r *registry) any() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.leases) > 0 && !r.closed
}

// mayLand records, unless settled, that a claim of key whose outcome is
// unknown found no row of its own: its statement may still write one. It
// reports whether a claim of key before it had recorded the same: a row of
// this holder with a fence above what the claim knew may be that one's.
func (r *registry) mayLand(key string, settled bool) (earlier bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	earlier = r.landing[key]
	if !settled {
		if r.landing == nil {
			r.landing = make(map[string]bool)
		}
		r.landing[key] = true
	}
	return earlier
}

// isClosed reports whether Close has begun.
func (r *registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}

// first reports whether this is the first time it is asked for k, and
// remembers that it was.
func (r *registry) first(k string) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.warned[k] {
		return false
	}
	if r.warned == nil {
		r.warned = map[string]bool{}
	}
	r.warned[k] = true
	return true
}

// addElector adds e, an Elector of key, unless Close has begun or another
// open Elector has that key.
func (r *registry) addElector(e *Elector, key string) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return ErrClosed
	}
	for other := range r.electors {
		if other.key == key && !other.isClosed() {
			// Both would claim with one holder: a waiting claim never takes
			// over its own Locker's lease, so the second would only wait.
			return errors.New("this Locker has an open Elector for that key already")
		}
	}
	if r.electors == nil {
		r.electors = make(map[*Elector]struct{})
	}
	r.electors[e] = struct{}{}
	return nil
}

// dropElector forgets e.
func (r *registry) dropElector(e *Elector) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.electors, e)
}

// electorsLeft are the Electors not yet dropped.
func (r *registry) electorsLeft() map[*Elector]struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	return maps.Clone(r.electors)
}

// close marks the registry closed, with Close's context, and returns its
// Electors (kept until dropped); first is false if an earlier Close did it.
func (r *registry) close(ctx context.Context, giveBackUntil time.Time) (electors map[*Elector]struct{}, first bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, false
	}
	r.closed, r.closeCtx, r.giveBackUntil = true, ctx, giveBackUntil
	return maps.Clone(r.electors), true
}

// calledFromElector reports whether its caller runs on the callbacks'
// goroutine of one of the Electors not yet dropped.
func (r *registry) calledFromElector() bool {
	r.mu.Lock()
	electors := slices.Collect(maps.Keys(r.electors))
	r.mu.Unlock()
	return slices.ContainsFunc(electors, func(e *Elector) bool { return e.calls.Calling() })
}

// stopHeartbeat stops the heartbeat and returns what is closed once its
// goroutine has returned (nil if it never started). Called once closed, it
// is final: no heartbeat starts after it.
func (r *registry) stopHeartbeat() <-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopBeat == nil {
		return nil
	}
	r.stopBeat()
	return r.beatDone
}

// closing returns Close's context and the bound of give-backs, once Close
// has begun (nil before).
func (r *registry) closing() (context.Context, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closeCtx, r.giveBackUntil
}

// giveUp records err, for Close to return.
func (r *registry) giveUp(err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.givenUp = append(r.givenUp, err)
}

// givenUpErrs are the errors giveUp recorded.
func (r *registry) givenUpErrs() []error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]error(nil), r.givenUp...)
}

// releaseStarted records the release of ls on its way: until it has
// finished, a claim of this Locker that waits for the key would take the
// row over from it (same holder), and the release would report ErrLost.
func (r *registry) releaseStarted(ls *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.releasing == nil {
		r.releasing = make(map[*Lease]chan struct{})
	}
	r.releasing[ls] = nil
}

// releaseFinished ends the record of ls's release, waking whoever waits
// for it.
func (r *registry) releaseFinished(ls *Lease) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if done := r.releasing[ls]; done != nil {
		close(done)
	}
	delete(r.releasing, ls)
}

// releaseOf is what ends a release of key in flight, if there is one.
func (r *registry) releaseOf(key string) (<-chan struct{}, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for ls := range r.releasing {
		if ls.key == key {
			return r.releaseDone(ls), true
		}
	}
	return nil, false
}

// releaseDone is what ends ls's release in flight, made at need; mu held.
func (r *registry) releaseDone(ls *Lease) chan struct{} {
	if r.releasing[ls] == nil {
		r.releasing[ls] = make(chan struct{})
	}
	return r.releasing[ls]
}

// releasesInFlight returns what ends each release on its way: Close waits
// for them, so that an Unlock that began before it cannot still be sending
// its release (on a pool the caller may close next) when Close returns.
func (r *registry) releasesInFlight() []<-chan struct{} {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := make([]<-chan struct{}, 0, len(r.releasing))
	for ls := range r.releasing {
		out = append(out, r.releaseDone(ls))
	}
	return out
}
