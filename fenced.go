package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// fenced is the protocol on a table created by Migrate: a fence
// column fed by a sequence, so that each mandate is matched on the
// replica's holder and its own fence. Its statements are in
// internal/sqlstmt, where they say why they are shaped that way.
type fenced struct {
	claimSQL, heartbeatSQL, releaseSQL string
	releaseOneSQL, releaseOneQuietSQL  string
	releaseQuietSQL                    string
	claimAllSQL, mandateSQL            string
	holder                             string
	// coalesceAll sends even one lease's release through the burst's
	// statement, as Locker.coalesceAll does its claim (tests,
	// export_test.go); set before the first claim.
	coalesceAll bool
}

func newFenced(t table, cfg config) *fenced {
	return &fenced{
		claimSQL:           t.render(sqlstmt.Claim),
		heartbeatSQL:       t.render(sqlstmt.Heartbeat),
		releaseSQL:         t.render(sqlstmt.Release),
		releaseOneSQL:      t.render(sqlstmt.ReleaseOne),
		releaseOneQuietSQL: t.render(sqlstmt.ReleaseOneQuiet),
		releaseQuietSQL:    t.render(sqlstmt.ReleaseQuiet),
		claimAllSQL:        t.render(sqlstmt.ClaimAll),
		mandateSQL:         t.render(sqlstmt.Mandate),
		holder:             cfg.holder,
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
	return releaseReported(ctx, db, p.releaseSQL, p.releaseQuietSQL, leases, fenceOf,
		p.holder, seconds(leases, minHoldOf), keys, fences, releaseLockWait)
}

// releaseLockWait is how long the release of one lease waits on its row's
// lock (sqlstmt.ReleaseOne) before it counts the row skipped: far longer
// than a claim in flight holds it, far shorter than a heartbeat interval.
const releaseLockWait = "20ms"

// releaseOne is release for one lease, in the statement that costs least
// (sqlstmt.ReleaseOne): a row locked past its lock wait is reported
// skipped, as release reports it.
func (p *fenced) releaseOne(ctx context.Context, db DB, ls *Lease) (map[*Lease]bool, error) {
	released, err := p.releaseOneWith(ctx, db, p.releaseOneSQL, ls)
	if released && driver.Is(err, driver.LockNotAvailable) {
		// The row came back, then the commit could not get the
		// notification queue's lock within the wait: nothing was
		// released. Once more, at once, without the notification.
		released, err = p.releaseOneWith(ctx, db, p.releaseOneQuietSQL, ls)
	}
	switch {
	case driver.Is(err, driver.LockNotAvailable) || driver.StatementTimedOut(ctx, err):
		// The row's lock outlasted the wait (lock_not_available), or a
		// statement_timeout of the session shorter than the wait
		// (query_canceled while the caller still waits): not released,
		// sent again later, as a row Release skips.
		return map[*Lease]bool{ls: false}, nil
	case err != nil:
		return nil, err
	case released:
		return map[*Lease]bool{ls: true}, nil
	}
	return map[*Lease]bool{}, nil
}

// releaseOneWith sends sql, a release of one lease, and reports whether its
// row came back, and the statement's error, which may come after the row
// (at its commit).
func (p *fenced) releaseOneWith(ctx context.Context, db DB, sql string, ls *Lease) (bool, error) {
	rows, err := db.Query(ctx, sql, p.holder, ls.key, ls.fence, ls.terms.minHold.Seconds(), releaseLockWait)
	if err != nil {
		return false, err
	}
	released := false
	for rows.Next() {
		released = true
	}
	rows.Close()
	return released, rows.Err()
}

// mandate reads the mandate of key's row; a key without a row carries
// none (not live): the claim whose outcome was unknown wrote nothing.
func (p *fenced) mandate(ctx context.Context, db DB, key string) (rowMandate, error) {
	var m rowMandate
	err := db.QueryRow(ctx, p.mandateSQL, key).Scan(&m.holder, &m.fence, &m.live)
	if errors.Is(err, pgx.ErrNoRows) {
		return rowMandate{}, nil
	}
	return m, err
}
