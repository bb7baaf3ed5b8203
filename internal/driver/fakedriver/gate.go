package fakedriver

import (
	"context"
	"fmt"
)

// Gate holds one statement until the test opens it, so that a test can
// order statements sent from other goroutines (a heartbeat round against a
// release) without sleeping: it waits on Arrived, does what must come
// first, then calls Open.
type Gate struct {
	ran     bool
	arrived chan struct{}
	open    chan struct{}
}

// Hold makes the next statement of kind this Driver sends wait at a Gate
// until it is opened: before it runs (ran false: it has written nothing,
// and whatever the test does meanwhile comes before it), or after it ran
// and before its reply (ran true: its writes are made, the caller does not
// know yet). Gates queue, one per statement, as faults do. A statement
// whose context ends while it waits returns the context's cause, an error
// of unknown outcome, having written nothing if it had not run.
func (d *Driver) Hold(kind Kind, ran bool) *Gate {
	g := &Gate{ran: ran, arrived: make(chan struct{}), open: make(chan struct{})}
	d.t.mu.Lock()
	defer d.t.mu.Unlock()
	d.gates[kind] = append(d.gates[kind], g)
	return g
}

// Arrived is closed once the statement waits at the gate.
func (g *Gate) Arrived() <-chan struct{} { return g.arrived }

// Open lets the statement go on. Call it once.
func (g *Gate) Open() { close(g.open) }

// hold waits at the gate, the table's mutex not held.
func (g *Gate) hold(ctx context.Context, kind Kind) error {
	close(g.arrived)
	select {
	case <-g.open:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("fakedriver: %s held at a gate: %w", kind, context.Cause(ctx))
	}
}
