package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// fenced is the protocol on a table created by Migrate: a fence column fed
// by a sequence, so that each lease is matched on the replica's holder and
// its own fence. Its statements are in internal/sqlstmt, where they say why
// they are shaped that way.
type fenced struct {
	claimSQL, heartbeatSQL, releaseSQL      string
	releaseOneSQL, releaseOneQuietSQL       string
	releaseQuietSQL                         string
	claimAllSQL, rowSQL, claimTickSQL       string
	releaseRunsSQL, releaseRunsQuietSQL     string
	releaseOneRunSQL, releaseOneRunQuietSQL string
	holder                                  string
	holderArg                               any // holder, boxed once: an argument of every claim and release
	ttl                                     time.Duration
	ttlArg                                  any // ttl in seconds, boxed once (ttlArgOf)
}

// Fenced is the protocol of holder on the table render names (it renders
// each sqlstmt template for that table), whose leases live ttl unless
// their terms say otherwise.
func Fenced(render func(string) string, holder string, ttl time.Duration) Protocol {
	return &fenced{
		claimSQL:              render(sqlstmt.Claim),
		heartbeatSQL:          render(sqlstmt.Heartbeat),
		releaseSQL:            render(sqlstmt.Release),
		releaseOneSQL:         render(sqlstmt.ReleaseOne),
		releaseOneQuietSQL:    render(sqlstmt.ReleaseOneQuiet),
		releaseQuietSQL:       render(sqlstmt.ReleaseQuiet),
		claimAllSQL:           render(sqlstmt.ClaimAll),
		claimTickSQL:          render(sqlstmt.ClaimTick),
		releaseRunsSQL:        render(sqlstmt.ReleaseRuns),
		releaseRunsQuietSQL:   render(sqlstmt.ReleaseRunsQuiet),
		releaseOneRunSQL:      render(sqlstmt.ReleaseOneRun),
		releaseOneRunQuietSQL: render(sqlstmt.ReleaseOneRunQuiet),
		rowSQL:                render(sqlstmt.RowLease),
		holder:                holder,
		holderArg:             holder,
		ttl:                   ttl,
		ttlArg:                ttl.Seconds(),
	}
}

// ttlArgOf is ttl in seconds, the argument of a claim: boxed once for the
// Locker's own TTL, at each claim for a job's of its own.
func (p *fenced) ttlArgOf(ttl time.Duration) any {
	if ttl == p.ttl {
		return p.ttlArg
	}
	return ttl.Seconds()
}

func (p *fenced) Bursts() bool { return true }

// Claim with a lock wait is a burst of one, the statement that carries one.
func (p *fenced) Claim(ctx context.Context, db DB, key string, ttl, lockWait time.Duration) (Claimed, bool, error) {
	if lockWait > 0 {
		got, err := p.ClaimAll(ctx, db, []string{key}, []float64{ttl.Seconds()}, lockWait)
		c, ok := got[key]
		return c, ok, err
	}
	type result struct {
		c  Claimed
		ok bool
	}
	r, err := retried(ctx, func() (result, error) {
		c, err := scanClaimed(db.QueryRow(ctx, p.claimSQL, key, p.holderArg, p.ttlArgOf(ttl)))
		c.Holder = p.holder
		c, ok, err := claimOutcomeOf(c, err)
		return result{c, ok}, err
	})
	return r.c, r.ok, err
}

func (p *fenced) ClaimTick(ctx context.Context, db DB, key string, ttl, lockWait time.Duration, tk Ticks) (TickClaim, error) {
	var wait *string
	if lockWait > 0 {
		w := fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))
		wait = &w
	}
	var tick *time.Time
	if !tk.CatchUp.IsZero() {
		tick = &tk.CatchUp
	}
	var period *int64
	if tk.Period > 0 {
		us := tk.Period.Microseconds()
		period = &us
	}
	return retried(ctx, func() (TickClaim, error) {
		var c TickClaim
		err := db.QueryRow(ctx, p.claimTickSQL, key, p.holder, ttl.Seconds(), period, wait, tick, tk.Instants).
			Scan(&c.Took, &c.Fence, &c.AcquiredAt, &c.ExpiresAt, &c.Live, &c.Table, &c.Holder, &c.RowTick, &c.Tick, &c.Released, &c.IsRun)
		if errors.Is(err, pgx.ErrNoRows) {
			return TickClaim{}, nil // no row: the claim's snapshot did not see the one that refused it
		}
		if c.RowTick.Unix() == 0 {
			c.RowTick = time.Time{} // the row had none (the statement says 'epoch')
		}
		c.Stale = err == nil && !c.Took && c.Tick.Unix() == 0
		return c, err
	})
}

func (p *fenced) ClaimAll(ctx context.Context, db DB, keys []string, ttls []float64, lockWait time.Duration) (map[string]Claimed, error) {
	return retried(ctx, func() (map[string]Claimed, error) {
		rows, err := db.Query(ctx, p.claimAllSQL, p.holderArg, ttls, keys, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1)))
		if err != nil {
			return nil, err
		}
		defer rows.Close()
		got := make(map[string]Claimed, len(keys))
		// Every row is scanned into the same destinations, made once per
		// statement rather than once per row.
		var row struct {
			key string
			c   Claimed
		}
		dest := []any{&row.key, &row.c.Fence, &row.c.AcquiredAt, &row.c.ExpiresAt, &row.c.Live, &row.c.Table, nil}
		for rows.Next() {
			row.key, row.c = "", Claimed{Holder: p.holder}
			if err := rows.Scan(dest...); err != nil {
				return nil, err
			}
			got[row.key] = row.c
		}
		return got, rows.Err()
	})
}

func (p *fenced) Extend(ctx context.Context, db DB, ms []Lease) (map[int]Extension, error) {
	return retried(ctx, func() (map[int]Extension, error) {
		keys, fences := keysAnd(ms, fenceOf)
		rows, err := db.Query(ctx, p.heartbeatSQL, p.holder, seconds(ms, ttlOf), keys, fences)
		if err != nil {
			return nil, err
		}
		return extensions(readReport(rows, ms, fenceOf, heartbeatFields))
	})
}

func (p *fenced) Release(ctx context.Context, db DB, ms []Lease) (map[int]bool, error) {
	return retried(ctx, func() (map[int]bool, error) {
		keys, fences := keysAnd(ms, fenceOf)
		if closesRuns(ms) {
			runs := make([]string, len(ms))
			for i, m := range ms {
				runs[i] = m.Run
			}
			return releaseReported(ctx, db, p.releaseRunsSQL, p.releaseRunsQuietSQL, ms, fenceOf,
				p.holderArg, seconds(ms, minHoldOf), keys, fences, ReleaseLockWait, runs)
		}
		return releaseReported(ctx, db, p.releaseSQL, p.releaseQuietSQL, ms, fenceOf,
			p.holderArg, seconds(ms, minHoldOf), keys, fences, ReleaseLockWait)
	})
}

// ReleaseOne sends sqlstmt.ReleaseOne: a row locked past its lock wait is
// reported skipped, as Release reports it.
func (p *fenced) ReleaseOne(ctx context.Context, db DB, m Lease) (map[int]bool, error) {
	return retried(ctx, func() (map[int]bool, error) {
		sql, quiet := p.releaseOneSQL, p.releaseOneQuietSQL
		if m.Run != "" {
			sql, quiet = p.releaseOneRunSQL, p.releaseOneRunQuietSQL
		}
		released, err := p.releaseOneWith(ctx, db, sql, m)
		if released && Is(err, LockNotAvailable) {
			// The row came back, then the commit could not get the
			// notification queue's lock within the wait: nothing was
			// released. Once more, at once, without the notification.
			released, err = p.releaseOneWith(ctx, db, quiet, m)
		}
		switch {
		case Is(err, LockNotAvailable) || StatementTimedOut(ctx, err):
			// The row's lock outlasted the wait (lock_not_available), or a
			// statement_timeout of the session shorter than the wait
			// (query_canceled while the caller still waits): not released,
			// sent again later, as a row Release skips.
			return oneSkipped, nil
		case err != nil:
			return nil, err
		case released:
			return oneReleased, nil
		}
		return oneLost, nil
	})
}

// The reports of ReleaseOne, one map each for every release of one lease,
// which its caller only reads: a release of one lease, the common one, then
// makes no map.
var (
	oneReleased = map[int]bool{0: true}
	oneSkipped  = map[int]bool{0: false}
	oneLost     = map[int]bool{}
)

// releaseOneWith sends sql, a release of one lease, and reports whether its
// row came back, and the statement's error, which may come after the row
// (at its commit).
func (p *fenced) releaseOneWith(ctx context.Context, db DB, sql string, m Lease) (bool, error) {
	args := append(make([]any, 0, 6), p.holderArg, m.Key, m.Fence, m.MinHold.Seconds(), ReleaseLockWait) // room for a run's: one allocation
	if m.Run != "" {
		args = append(args, m.Run)
	}
	rows, err := db.Query(ctx, sql, args...)
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

// ReadRow reads the lease key's row carries once a transaction holding it
// has ended (waiting at most lockWait); a key without a row carries none
// (not live): the claim whose outcome was unknown wrote nothing.
func (p *fenced) ReadRow(ctx context.Context, db DB, key string, lockWait time.Duration) (RowLease, error) {
	var m RowLease
	err := db.QueryRow(ctx, p.rowSQL, key, fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))).Scan(&m.Holder, &m.Fence, &m.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return RowLease{}, nil
	}
	return m, err
}
