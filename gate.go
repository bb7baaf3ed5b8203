package pglease

import (
	"context"
	"sync"
)

// roundGate orders heartbeat rounds against releases: a round runs alone,
// releases run together. A release must not run while a round is in flight,
// or the round could re-arm the lease just released (with a min hold its row
// still matches the heartbeat's guard); releases of different leases have
// nothing to order between them. A waiting round goes before new releases,
// so a stream of releases cannot starve the heartbeat.
type roundGate struct {
	mu       sync.Mutex
	releases int           // releases in flight
	round    bool          // a round in flight
	waiting  int           // rounds waiting
	changed  chan struct{} // closed and replaced whenever the above change
	initOnce sync.Once
}

func (g *roundGate) init() { g.initOnce.Do(func() { g.changed = make(chan struct{}) }) }

// enter waits until a round (exclusive) or a release may run, or ctx ends.
func (g *roundGate) enter(ctx context.Context, exclusive bool) error {
	g.init()
	g.mu.Lock()
	if exclusive {
		g.waiting++
		defer func() { g.mu.Lock(); g.waiting--; g.signal(); g.mu.Unlock() }()
	}
	for {
		if exclusive && !g.round && g.releases == 0 {
			g.round = true
			g.mu.Unlock()
			return nil
		}
		if !exclusive && !g.round && g.waiting == 0 {
			g.releases++
			g.mu.Unlock()
			return nil
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

// leave ends what enter let in.
func (g *roundGate) leave(exclusive bool) {
	g.mu.Lock()
	defer g.mu.Unlock()
	if exclusive {
		g.round = false
	} else {
		g.releases--
	}
	g.signal()
}

// signal wakes every waiter; the caller holds mu.
func (g *roundGate) signal() {
	close(g.changed)
	g.changed = make(chan struct{})
}
