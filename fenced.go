package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// fenced is the protocol of DESIGN, on a table created by Migrate: a fence
// column fed by a sequence, so that each mandate is matched on the
// replica's holder and its own fence. Its statements are in
// internal/sqlstmt, where they say why they are shaped that way.
type fenced struct {
	claimSQL, heartbeatSQL, releaseSQL string
	releaseOneSQL                      string
	claimAllSQL, mandateSQL            string
	holder                             string
	// coalesceAll sends even one lease's release through the burst's
	// statement, as Locker.coalesceAll does its claim (tests,
	// export_test.go); set before the first claim.
	coalesceAll bool
}

func newFenced(t table, cfg config) *fenced {
	return &fenced{
		claimSQL:      t.render(sqlstmt.Claim),
		heartbeatSQL:  t.render(sqlstmt.Heartbeat),
		releaseSQL:    t.render(sqlstmt.Release),
		releaseOneSQL: t.render(sqlstmt.ReleaseOne),
		claimAllSQL:   t.render(sqlstmt.ClaimAll),
		mandateSQL:    t.render(sqlstmt.Mandate),
		holder:        cfg.holder,
	}
}

// fenceOf is the mandate of a lease of this protocol.
func fenceOf(ls *Lease) int64 { return ls.fence }

func (p *fenced) claim(ctx context.Context, db DB, key string, ttl time.Duration) (claimed, bool, error) {
	c := claimed{holder: p.holder}
	err := db.QueryRow(ctx, p.claimSQL, key, p.holder, ttl.Seconds()).Scan(&c.fence, &c.acquiredAt, &c.expiresAt, &c.live, &c.table, nil)
	return claimOutcomeOf(c, err)
}

func (p *fenced) claimAll(ctx context.Context, db DB, keys []string, ttls []float64, lockWait time.Duration) (map[string]claimed, error) {
	rows, err := db.Query(ctx, p.claimAllSQL, p.holder, ttls, keys, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1)))
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	got := make(map[string]claimed, len(keys))
	for rows.Next() {
		var key string
		c := claimed{holder: p.holder}
		if err := rows.Scan(&key, &c.fence, &c.acquiredAt, &c.expiresAt, &c.live, &c.table, nil); err != nil {
			return nil, err
		}
		got[key] = c
	}
	return got, rows.Err()
}

func (p *fenced) extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error) {
	keys, fences := mandates(leases, fenceOf)
	rows, err := db.Query(ctx, p.heartbeatSQL, p.holder, seconds(leases, ttlOf), keys, fences)
	if err != nil {
		return nil, err
	}
	return extensions(readReport(rows, leases, fenceOf, heartbeatFields))
}

func (p *fenced) release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	if len(leases) == 1 && !p.coalesceAll {
		return p.releaseOne(ctx, db, leases[0])
	}
	keys, fences := mandates(leases, fenceOf)
	rows, err := db.Query(ctx, p.releaseSQL, p.holder, seconds(leases, minHoldOf), keys, fences)
	if err != nil {
		return nil, err
	}
	return readReport(rows, leases, fenceOf, releaseFields)
}

// releaseLockWait is how long the release of one lease waits on its row's
// lock (sqlstmt.ReleaseOne) before it counts the row skipped: far longer
// than a claim in flight holds it, far shorter than a heartbeat interval.
const releaseLockWait = "20ms"

// releaseOne is release for one lease, in the statement that costs least
// (sqlstmt.ReleaseOne): a row locked past its lock wait is reported
// skipped, as release reports it.
func (p *fenced) releaseOne(ctx context.Context, db DB, ls *Lease) (map[*Lease]bool, error) {
	released := false
	rows, err := db.Query(ctx, p.releaseOneSQL, p.holder, ls.key, ls.fence, ls.terms.minHold.Seconds(), releaseLockWait)
	if err == nil {
		for rows.Next() {
			released = true
		}
		rows.Close()
		err = rows.Err()
	}
	var pgErr *pgconn.PgError
	switch {
	case errors.As(err, &pgErr) && pgErr.Code == "55P03": // lock_not_available
		return map[*Lease]bool{ls: false}, nil
	case err != nil:
		return nil, err
	case released:
		return map[*Lease]bool{ls: true}, nil
	}
	return map[*Lease]bool{}, nil
}

func (p *fenced) mandate(ctx context.Context, db DB, key string) (rowMandate, error) {
	var m rowMandate
	err := db.QueryRow(ctx, p.mandateSQL, key).Scan(&m.holder, &m.fence, &m.live)
	return m, err
}
