package pglease

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// protocol is the SQL a Locker speaks to its table. The default, fenced,
// runs the statements of DESIGN: a fence column fed by a sequence. unfenced
// (WithoutFenceColumn) works on a table it cannot alter, with a holder
// identifier forged per mandate instead of a fence.
//
// Every method is one statement and one round trip.
type protocol interface {
	// claim takes key for ttl; ok is false when another holder's lease is
	// live.
	claim(ctx context.Context, db DB, key string, ttl time.Duration) (c claimed, ok bool, err error)
	// extend runs one heartbeat round, each lease extended by its own TTL,
	// and reports on each lease whose row
	// still matched: extended to a new server expiry, or locked by another
	// transaction and to be retried. The others are lost.
	extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error)
	// release expires the rows of leases in one statement, each kept for
	// its own min hold, and reports on
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
}

func newFenced(t table, cfg config) *fenced {
	return &fenced{
		claimSQL:     t.render(sqlstmt.Claim),
		heartbeatSQL: t.render(sqlstmt.Heartbeat),
		releaseSQL:   t.render(sqlstmt.Release),
		claimAllSQL:  t.render(sqlstmt.ClaimAll),
		holder:       cfg.holder,
	}
}

// seconds is each lease's TTL or min hold in seconds, as make_interval
// takes them: the array a heartbeat or release statement carries beside
// the keys, so that one statement serves leases of every TTL (Locker.Job).
func seconds(leases []*Lease, of func(terms) time.Duration) []float64 {
	out := make([]float64, len(leases))
	for i, ls := range leases {
		out[i] = of(ls.terms).Seconds()
	}
	return out
}
