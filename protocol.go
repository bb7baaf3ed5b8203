package pglease

import (
	"context"
)

// protocol is the SQL a Locker speaks to its table. The default, fenced,
// runs the statements of DESIGN: a fence column fed by a sequence. unfenced
// (WithoutFenceColumn) works on a table it cannot alter, with a holder
// identifier forged per mandate instead of a fence.
//
// Every method is one statement and one round trip.
type protocol interface {
	// claim takes key; ok is false when another holder's lease is live.
	claim(ctx context.Context, db DB, key string) (c claimed, ok bool, err error)
	// extend runs one heartbeat round and reports on each lease whose row
	// still matched: extended to a new server expiry, or locked by another
	// transaction and to be retried. The others are lost.
	extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error)
	// release expires the rows of leases in one statement and reports on
	// each lease whose row still matched: released (true), or locked by
	// another transaction and to be sent again (false). The others were
	// lost.
	release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error)
}

// fenced is the protocol of DESIGN, on a table created by Migrate.
type fenced struct {
	claimSQL, heartbeatSQL, releaseSQL string
	claimAllSQL                        string
	holder                             string
	ttl, minHold                       float64 // seconds, as make_interval takes them
}

func newFenced(t table, cfg config) *fenced {
	return &fenced{
		claimSQL:     t.render(claimSQL),
		heartbeatSQL: t.render(heartbeatSQL),
		releaseSQL:   t.render(releaseSQL),
		claimAllSQL:  t.render(claimAllSQL),
		holder:       cfg.holder,
		ttl:          cfg.ttl.Seconds(),
		minHold:      cfg.minHold.Seconds(),
	}
}
