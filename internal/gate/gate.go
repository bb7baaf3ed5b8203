// Package gate orders rounds against releases: a round runs alone,
// releases run together.
//
// A Locker's heartbeat round must not run while a release is in flight,
// nor a release while a round is, or the round could re-arm the lease just
// released (with a min hold its row still matches the heartbeat's guard);
// releases of different leases have nothing to order between them.
//
// What a Gate guarantees:
//
//   - While a round is in, nothing else is; while releases are in, no
//     round is.
//   - A waiting round goes before releases that arrive after it, so that a
//     stream of releases cannot starve the rounds.
//   - A caller whose context ends while it waits gets the context's cause
//     and is not let in.
package gate

import (
	"context"
	"sync"
)

// Gate lets rounds in alone and releases in together. The zero value is
// ready to use.
type Gate struct {
	mu       sync.Mutex
	releases int           // releases in
	round    bool          // a round in
	waiting  int           // rounds waiting
	changed  chan struct{} // made by a waiter, closed (and forgotten) when the above change
}

// EnterRound waits until a round may run alone, or until ctx ends. A nil
// error lets the round in; the caller calls LeaveRound when it is done.
func (g *Gate) EnterRound(ctx context.Context) error { return g.enter(ctx, true) }

// LeaveRound ends what EnterRound let in.
func (g *Gate) LeaveRound() { g.leave(true) }

// EnterRelease waits until no round runs or waits, or until ctx ends. A nil
// error lets the release in; the caller calls LeaveRelease when it is done.
func (g *Gate) EnterRelease(ctx context.Context) error { return g.enter(ctx, false) }

// LeaveRelease ends what EnterRelease let in.
func (g *Gate) LeaveRelease() { g.leave(false) }

func (g *Gate) enter(ctx context.Context, round bool) error {
	g.mu.Lock()
	if round {
		g.waiting++
		defer func() { g.mu.Lock(); g.waiting--; g.signal(); g.mu.Unlock() }()
	}
	for {
		if round && !g.round && g.releases == 0 {
			g.round = true
			g.mu.Unlock()
			return nil
		}
		if !round && !g.round && g.waiting == 0 {
			g.releases++
			g.mu.Unlock()
			return nil
		}
		if g.changed == nil {
			g.changed = make(chan struct{})
		}
		wait := g.changed
		g.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return context.Cause(ctx)
		}
		g.mu.Lock()
	}
}

func (g *Gate) leave(round bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if round {
		g.round = false
	} else {
		g.releases--
	}
	g.signal()
}

// signal wakes every waiter; the caller holds mu.
func (g *Gate) signal() {
	if g.changed != nil {
		close(g.changed)
		g.changed = nil
	}
}
