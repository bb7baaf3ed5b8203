package fakedriver

import (
	"context"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/driver"
)

// ClaimTick claims key for ttl for one tick of a job's schedule, as
// sqlstmt.ClaimTick does, and returns what it took, or the row as it
// stood.
//
//   - The tick (nearestTick) is read from the clock once, with the
//     statement.
//   - The claim takes the row only for a tick after the row's (or a row
//     without one), so that a tick run and released, or lapsed, is never
//     run again; and, as every claim, only a row that is expired or the
//     holder's own. Two exceptions take the row of that very tick: it
//     expired and its claim was given back (it ran nothing), or the claim
//     is a catch-up of that tick and its run lapsed (expired, never
//     released).
//   - A run taken live is entered in the ledger, open, under its fence
//     and tick: a release closes it (Run), and the rules above read it.
//
// This table has no revocation, so no row is revoked.
func (d *Driver) ClaimTick(ctx context.Context, _ driver.DB, key string, ttl, lockWait time.Duration, tk driver.Ticks) (driver.TickClaim, error) {
	var got driver.TickClaim
	err := d.send(ctx, ClaimTick, func() error {
		var err error
		got, err = d.claimTick(key, ttl, lockWait, tk, d.t.clock())
		return err
	})
	if err != nil {
		return driver.TickClaim{}, err
	}
	return got, nil
}

// claimTick is ClaimTick's statement, with t.mu held.
func (d *Driver) claimTick(key string, ttl, lockWait time.Duration, tk driver.Ticks, now time.Time) (driver.TickClaim, error) {
	tick, ok, err := nearestTick(tk, now)
	if err != nil {
		return driver.TickClaim{}, err
	}
	if !ok {
		// Stale: the clock lies outside the instants sent. The real
		// statement says 'epoch' for the tick, which the driver reads as
		// Stale.
		return driver.TickClaim{Claimed: driver.Claimed{AcquiredAt: now, ExpiresAt: now}, Tick: time.Unix(0, 0).UTC(), Stale: true}, nil
	}
	cur, exists := d.t.rows[key]
	if exists && !d.mayTakeTick(cur, tick, !tk.CatchUp.IsZero(), now) {
		_, isRun := d.t.runs[keyOfRun(cur.fence, cur.tick)]
		return driver.TickClaim{
			Claimed: driver.Claimed{
				Holder: cur.holder, Fence: cur.fence, AcquiredAt: cur.acquired, ExpiresAt: cur.expires,
				Live: cur.live(now), Table: OID,
			},
			Tick:     tick,
			RowTick:  cur.tick,
			Released: !cur.released.IsZero(),
			IsRun:    !cur.tick.IsZero() && isRun,
		}, nil
	}
	if w := d.t.waitFor(key, lockWait); exists && w != nil {
		return driver.TickClaim{}, w
	}
	next := row{holder: d.holder, fence: d.t.drawFence(), acquired: now, expires: now.Add(interval(ttl)), tick: tick}
	if exists {
		next.expires = latest(cur.expires, next.expires)
	}
	if err := checkRow(key, next); err != nil {
		return driver.TickClaim{}, err
	}
	d.t.rows[key] = &next
	if next.live(now) {
		d.t.runs[keyOfRun(next.fence, tick)] = ""
	}
	return driver.TickClaim{Claimed: claimed(next, now), Took: true, Tick: tick, RowTick: tick, IsRun: true}, nil
}

// mayTakeTick reports whether a claim of tick by the holder at now takes
// the row cur (catchUp: the claim is a catch-up of tick).
func (d *Driver) mayTakeTick(cur *row, tick time.Time, catchUp bool, now time.Time) bool {
	if cur.holder != d.holder && cur.live(now) {
		return false
	}
	switch {
	case cur.tick.IsZero(), cur.tick.Before(tick):
		return true
	case !cur.tick.Equal(tick):
		return false // the row's tick is later
	}
	outcome, isRun := d.t.runs[keyOfRun(cur.fence, cur.tick)]
	givenBack := !cur.live(now) && isRun && outcome == driver.RunGivenBack
	lapsed := catchUp && !cur.live(now) && cur.released.IsZero() && isRun
	return givenBack || lapsed
}

// nearestTick is the tick a claim at now claims: the catch-up's tick; or
// the multiple of the period since the Unix epoch nearest now, a half
// rounded up; or the instant sent nearest now, a tie to the later, only
// when now lies between the first and the last of them (ok false
// otherwise: a stale claim). Times are in whole microseconds, as the
// server keeps them.
func nearestTick(tk driver.Ticks, now time.Time) (tick time.Time, ok bool, err error) {
	switch {
	case !tk.CatchUp.IsZero():
		return tk.CatchUp.Truncate(time.Microsecond).UTC(), true, nil
	case tk.Period > 0:
		p := tk.Period.Microseconds()
		if p == 0 {
			return time.Time{}, false, &pgconn.PgError{Severity: "ERROR", Code: driver.DivisionByZero, Message: "division by zero"}
		}
		us := now.UnixMicro()
		return time.UnixMicro((us + p/2) / p * p).UTC(), true, nil
	case len(tk.Instants) == 0:
		return time.Time{}, false, nil
	}
	lo, hi := tk.Instants[0], tk.Instants[0]
	for _, c := range tk.Instants {
		if c.Before(lo) {
			lo = c
		}
		if c.After(hi) {
			hi = c
		}
	}
	if now.Before(lo.Truncate(time.Microsecond)) || now.After(hi.Truncate(time.Microsecond)) {
		return time.Time{}, false, nil
	}
	best := time.Time{}
	for _, c := range tk.Instants {
		c = c.Truncate(time.Microsecond).UTC()
		switch {
		case best.IsZero(), absDuration(c.Sub(now)) < absDuration(best.Sub(now)):
			best = c
		case absDuration(c.Sub(now)) == absDuration(best.Sub(now)) && c.After(best):
			best = c
		}
	}
	return best, true, nil
}

func absDuration(d time.Duration) time.Duration {
	if d < 0 {
		return -d
	}
	return d
}
