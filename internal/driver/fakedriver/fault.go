package fakedriver

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pglease/internal/driver"
)

// Kind is a kind of statement, named after the Protocol method that sends
// it. A Claim with a lock wait is still a Claim here, though the real
// driver sends it as a burst of one.
type Kind int

// The kinds of statement.
const (
	Claim Kind = iota
	ClaimAll
	ClaimTick
	Extend
	Release
	ReleaseOne
	ReadRow
	kinds // how many
)

func (k Kind) String() string {
	switch k {
	case Claim:
		return "claim"
	case ClaimAll:
		return "claim of many keys"
	case ClaimTick:
		return "claim of a tick"
	case Extend:
		return "heartbeat"
	case Release:
		return "release"
	case ReleaseOne:
		return "release of one lease"
	case ReadRow:
		return "read of a row"
	}
	return fmt.Sprintf("Kind(%d)", int(k))
}

// fault is a failure queued for a statement of one kind (FailNext).
type fault struct {
	err error
	ran bool // the statement's writes are made before it fails
}

// FailNext makes the next statement of kind this Driver sends fail with
// err, once. With ran, the statement first runs and writes what it writes,
// then reports err instead of its result: a reply lost after the commit.
// Without, it writes nothing. Faults queue: each call fails one more
// statement of that kind, in order.
//
// An err of SQLSTATE 40001 is sent again, as the real driver sends a
// statement again on a serialization failure (except ReadRow): only the
// first attempt fails. Which outcome the caller reads in err (done, not
// sent, unknown) is driver.OutcomeOf's: wrap it in driver.NotSentError
// for a statement that never left, give a *pgconn.PgError for the
// server's answer, anything else for a lost reply.
func (d *Driver) FailNext(kind Kind, err error, ran bool) {
	d.t.mu.Lock()
	defer d.t.mu.Unlock()
	d.faults[kind] = append(d.faults[kind], fault{err: err, ran: ran})
}

// send runs one statement of kind: write, under the table's mutex, makes
// its writes and fills the caller's result. It is sent again on a
// serialization failure, as the real driver's statements are (but
// ReadRow).
func (d *Driver) send(ctx context.Context, kind Kind, write func() error) error {
	if kind == ReadRow {
		return d.attempt(ctx, kind, write)
	}
	return driver.RetrySerialization(ctx, func() error { return d.attempt(ctx, kind, write) })
}

// attempt is one sending of a statement: the faults and gates queued for
// its kind apply to it, in the order a statement meets them (a gate before
// it runs, a fault before it runs, the statement, a gate holding its
// reply, a fault replacing its reply).
func (d *Driver) attempt(ctx context.Context, kind Kind, write func() error) error {
	if ctx.Err() != nil {
		// As a statement whose context ended while it waited for a
		// connection: it never left.
		return driver.NotSentError(fmt.Errorf("fakedriver: %s: %w", kind, context.Cause(ctx)))
	}
	f, g := d.next(kind)
	if g != nil && !g.ran {
		if err := g.hold(ctx, kind); err != nil {
			return err
		}
	}
	if f != nil && !f.ran {
		return f.err
	}
	err := d.run(ctx, kind, write)
	if g != nil && g.ran {
		if err := g.hold(ctx, kind); err != nil {
			return err
		}
	}
	if f != nil {
		return f.err
	}
	return err
}

// next takes the fault and the gate queued first for kind, if any.
func (d *Driver) next(kind Kind) (*fault, *Gate) {
	d.t.mu.Lock()
	defer d.t.mu.Unlock()
	var f *fault
	if q := d.faults[kind]; len(q) > 0 {
		f, d.faults[kind] = &q[0], q[1:]
	}
	var g *Gate
	if q := d.gates[kind]; len(q) > 0 {
		g, d.gates[kind] = q[0], q[1:]
	}
	return f, g
}

// run runs write under the table's mutex, and again each time it returned
// a lockWaitError, once that wait is over; the clock steps after the run that
// wrote.
func (d *Driver) run(ctx context.Context, kind Kind, write func() error) error {
	for {
		d.t.mu.Lock()
		err := write()
		var w *lockWaitError
		if !errors.As(err, &w) {
			d.t.step()
			d.t.mu.Unlock()
			return err
		}
		d.t.mu.Unlock()
		if err := w.wait(ctx, kind); err != nil {
			return err
		}
	}
}
