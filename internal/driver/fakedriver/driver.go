package fakedriver

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/driver"
)

// Driver is the fenced protocol of one holder on a Table. The db argument
// of its methods is ignored: the table is the database. Its faults and
// gates apply to its own statements only, so that a test fails the
// heartbeat of one Locker and not of another on the same table.
type Driver struct {
	t      *Table
	holder string
	faults [kinds][]fault // guarded by t.mu
	gates  [kinds][]*Gate // guarded by t.mu
}

var _ driver.Protocol = (*Driver)(nil)

// Bursts reports true: a claim of many keys is one statement, as in
// driver.Fenced.
func (d *Driver) Bursts() bool { return true }

// Claim takes key for ttl: a missing row, an expired one or the holder's
// own (re-entrant), each with a new fence; another holder's live row is
// refused (ok false). A row it would take that is locked (Lock) is
// waited for, at most lockWait when not 0.
func (d *Driver) Claim(ctx context.Context, _ driver.DB, key string, ttl, lockWait time.Duration) (driver.Claimed, bool, error) {
	var (
		c  driver.Claimed
		ok bool
	)
	err := d.send(ctx, Claim, func() error {
		now := d.t.clock()
		next, took, err := d.take(key, ttl, lockWait, now)
		c, ok = driver.Claimed{Holder: d.holder}, took
		if !took || err != nil {
			return err
		}
		if err := checkRow(key, next); err != nil {
			return err
		}
		d.t.rows[key] = &next
		c = claimed(next, now)
		return nil
	})
	if err != nil {
		return driver.Claimed{Holder: d.holder}, false, err
	}
	return c, ok, nil
}

// ClaimAll claims each of keys as Claim does, each for its TTL in ttls
// (seconds), in one statement: all its writes or none. The keys are taken
// in byte order, as the real statement inserts them, so that the fences
// drawn follow that order. A key missing from the result is held by
// another holder.
func (d *Driver) ClaimAll(ctx context.Context, _ driver.DB, keys []string, ttls []float64, lockWait time.Duration) (map[string]driver.Claimed, error) {
	if len(ttls) != len(keys) {
		return nil, fmt.Errorf("fakedriver: claim of %d keys with %d TTLs", len(keys), len(ttls))
	}
	order := make([]int, len(keys))
	for i := range order {
		order[i] = i
	}
	slices.SortFunc(order, func(a, b int) int { return strings.Compare(keys[a], keys[b]) }) // byte order, as COLLATE "C"
	for i := 1; i < len(order); i++ {
		if keys[order[i]] == keys[order[i-1]] {
			return nil, fmt.Errorf("fakedriver: claim of key %q twice in one statement", keys[order[i]])
		}
	}
	var got map[string]driver.Claimed
	err := d.send(ctx, ClaimAll, func() error {
		now := d.t.clock()
		taken := make(map[string]row, len(keys))
		for _, i := range order {
			next, took, err := d.take(keys[i], time.Duration(ttls[i]*float64(time.Second)), max(lockWait, time.Millisecond), now)
			if err != nil {
				return err
			}
			if !took {
				continue
			}
			if err := checkRow(keys[i], next); err != nil {
				return err // the fences drawn stay drawn, as a sequence's
			}
			taken[keys[i]] = next
		}
		got = make(map[string]driver.Claimed, len(taken))
		for key, next := range taken {
			d.t.rows[key] = &next
			got[key] = claimed(next, now)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// take judges key's row for a claim of the holder at now, as the claim's
// conflict arm does, and returns the row the claim writes, with its fence
// drawn; false when another holder's lease is live. It writes nothing. A
// row it would take that is locked is waited for (lockWait, 0: as long
// as it is held), before any fence is drawn.
//
//   - The expiry is never moved back: a re-entrant claim with a shorter
//     TTL keeps the later expiry of the lease it supersedes.
//   - A plain claim keeps the row's tick, and clears its release time.
func (d *Driver) take(key string, ttl, lockWait time.Duration, now time.Time) (row, bool, error) {
	next := row{holder: d.holder, acquired: now, expires: now.Add(interval(ttl))}
	if cur, ok := d.t.rows[key]; ok {
		if cur.holder != d.holder && cur.live(now) {
			return row{}, false, nil
		}
		if w := d.t.waitFor(key, lockWait); w != nil {
			return row{}, false, w
		}
		next.expires = latest(cur.expires, next.expires)
		next.tick = cur.tick
	}
	next.fence = d.t.drawFence()
	return next, true, nil
}

// claimed is what a claim returns for the row it wrote.
func claimed(r row, now time.Time) driver.Claimed {
	return driver.Claimed{Holder: r.holder, Fence: r.fence, AcquiredAt: r.acquired, ExpiresAt: r.expires, Live: r.live(now), Table: OID}
}

// Extend extends each lease whose row still matches (its key, the holder,
// its fence, live) to now plus its TTL, never moving an expiry back, and
// reports those; the others are lost. A lease whose row is locked (Lock)
// is reported Locked, not extended.
func (d *Driver) Extend(ctx context.Context, _ driver.DB, ms []driver.Lease) (map[int]driver.Extension, error) {
	var got map[int]driver.Extension
	err := d.send(ctx, Extend, func() error {
		now := d.t.clock()
		got = make(map[int]driver.Extension, len(ms))
		last := lastOfKeys(ms)
		for i, m := range ms {
			r := d.mine(m, now)
			if r == nil {
				continue
			}
			if d.t.locked(m.Key) {
				if last[m.Key] == i {
					got[i] = driver.Extension{Locked: true, ServerNow: now}
				}
				continue
			}
			r.expires = latest(r.expires, now.Add(interval(m.TTL)))
			if last[m.Key] == i {
				got[i] = driver.Extension{ExpiresAt: r.expires, ServerNow: now}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// Release expires in place the row of each lease that still matches, at
// now or, under a min hold, at its acquired time plus the hold, whichever
// is later (and at least a microsecond after its acquired time, so the
// CHECK holds after a clock stepped back); it reports those released
// (true), and those whose row is locked (Lock) to be sent again (false);
// the others are lost. A lease of a tick (Run) closes its run in
// the ledger with that outcome; a give-back leaves the row unreleased,
// reading as a run that lapsed.
func (d *Driver) Release(ctx context.Context, _ driver.DB, ms []driver.Lease) (map[int]bool, error) {
	return d.release(ctx, Release, ms)
}

// ReleaseOne is Release of one lease.
func (d *Driver) ReleaseOne(ctx context.Context, _ driver.DB, m driver.Lease) (map[int]bool, error) {
	return d.release(ctx, ReleaseOne, []driver.Lease{m})
}

func (d *Driver) release(ctx context.Context, kind Kind, ms []driver.Lease) (map[int]bool, error) {
	var got map[int]bool
	err := d.send(ctx, kind, func() error {
		now := d.t.clock()
		got = make(map[int]bool, len(ms))
		last := lastOfKeys(ms)
		for i, m := range ms {
			r := d.mine(m, now)
			if r == nil {
				continue
			}
			if d.t.locked(m.Key) {
				if last[m.Key] == i {
					got[i] = false
				}
				continue
			}
			r.expires = latest(now, r.acquired.Add(interval(m.MinHold)), r.acquired.Add(time.Microsecond))
			r.released = now
			if m.Run == driver.RunGivenBack {
				r.released = time.Time{}
			}
			if k := keyOfRun(r.fence, r.tick); m.Run != "" && !r.tick.IsZero() {
				if outcome, ok := d.t.runs[k]; ok && outcome == "" {
					d.t.runs[k] = m.Run
				}
			}
			if last[m.Key] == i {
				got[i] = true
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return got, nil
}

// ReadRow reads the lease key's row carries; a key without a row carries
// none (not live).
func (d *Driver) ReadRow(ctx context.Context, _ driver.DB, key string, _ time.Duration) (driver.RowLease, error) {
	var got driver.RowLease
	err := d.send(ctx, ReadRow, func() error {
		got = driver.RowLease{}
		if r, ok := d.t.rows[key]; ok {
			got = r.rowLease(d.t.clock())
		}
		return nil
	})
	if err != nil {
		return driver.RowLease{}, err
	}
	return got, nil
}

// mine is the row m still matches (its key, the holder, its fence, live
// at now), or nil. Holders are compared byte for byte, as COLLATE "C".
func (d *Driver) mine(m driver.Lease, now time.Time) *row {
	r, ok := d.t.rows[m.Key]
	if !ok || r.holder != d.holder || r.fence != m.Fence || !r.live(now) {
		return nil
	}
	return r
}

// lastOfKeys is, for each key of ms, the index of its last lease: a row
// reported by a heartbeat or release counts only for that one, as the real
// driver reads the report (a key is never sent twice in practice).
func lastOfKeys(ms []driver.Lease) map[string]int {
	last := make(map[string]int, len(ms))
	for i, m := range ms {
		last[m.Key] = i
	}
	return last
}

// latest is the latest of ts, as GREATEST.
func latest(ts ...time.Time) time.Time {
	out := ts[0]
	for _, t := range ts[1:] {
		if t.After(out) {
			out = t
		}
	}
	return out
}
