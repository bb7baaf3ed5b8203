package pglease

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
	"github.com/pglease/pglease/internal/trust"
)

var _ gocron.Lock = (*Lease)(nil)

// Lease is one successful claim of a key, known by the fence the database
// issued for that claim. It is held until Unlock, until it is lost, or until
// its Locker is closed; Done and Err tell which.
type Lease struct {
	locker     *Locker
	key        string
	holder     string // the holder column of this lease
	fence      int64
	acquiredAt time.Time
	table      uint32 // oid of the lease table the claim wrote to
	terms      terms  // its TTL, min hold and timeout: the Locker's, or a job's
	tick       time.Time
	givenBack  bool        // a claim's row given back (giveBack): it ran nothing
	failed     atomic.Bool // its run (Locker.Task) returned an error

	mu           sync.Mutex
	expiresAt    time.Time      // server time, from the last claim or heartbeat
	trustUntil   trust.Deadline // sent_at + its TTL - margin of the last claim or heartbeat
	trustTimer   *time.Timer    // ends the lease at trustUntil, whatever else is going on
	err          error          // nil while held
	done         chan struct{}  // made by the first Done, if any (few leases are watched so)
	ended        bool           // end has run to its last step: Done is closed
	skippedSince time.Time      // when a round first found its row locked; zero once extended
	released     bool           // a release was attempted
	releaseErr   error          // its outcome, returned by later Unlocks
	watchers     map[int]func(error)
	nextWatch    int
}

// Key is the key the lease is on.
func (ls *Lease) Key() string { return ls.key }

// Holder is the holder this lease wrote in its row: the Locker's holder, or
// with WithoutFenceColumn the identifier forged for this one claim.
func (ls *Lease) Holder() string { return ls.holder }

// Fence is the fencing token the database issued for this claim; a key's
// fences only grow. Pass it to every downstream write, and let the
// downstream refuse a fence lower than one it has seen. Fences are not
// consecutive: a jump of two or more means no lost lease. See docs/GUIDE.md,
// "Lease.Fence".
func (ls *Lease) Fence() int64 { return ls.fence }

// Tick is the tick of the job's schedule the lease was claimed for
// (WithPeriod or WithCron), or the zero time for a lease of no tick.
func (ls *Lease) Tick() time.Time { return ls.tick }

// AcquiredAt is the server time of the claim.
func (ls *Lease) AcquiredAt() time.Time { return ls.acquiredAt }

// ExpiresAt is the server's expiry of the lease, as of the last successful
// claim or heartbeat.
func (ls *Lease) ExpiresAt() time.Time {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.expiresAt
}

// Done is closed once the lease ends: released, lost, or its Locker closed.
func (ls *Lease) Done() <-chan struct{} {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.done == nil {
		ls.done = make(chan struct{})
		if ls.ended {
			close(ls.done)
		}
	}
	return ls.done
}

// Err is nil while the lease is held. Once it ends, Err wraps ErrLost if it
// was lost (taken, lapsed, or past its trust deadline); otherwise it is
// ErrReleased after Unlock, or ErrClosed after the Locker's Close.
func (ls *Lease) Err() error {
	ls.checkTrust(time.Now())
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// Context returns a context derived from parent that is cancelled the moment
// the lease ends, with the lease's Err as its cause (context.Cause); do the
// job's work under it, and call cancel when done. It also ends with parent:
// a run still going at gocron's Shutdown sees context.Canceled, not ErrLost.
func (ls *Lease) Context(parent context.Context) (context.Context, context.CancelFunc) {
	mustContext(parent, "Lease.Context")
	ctx, cancel := context.WithCancelCause(parent)
	ls.checkTrust(time.Now())
	ls.mu.Lock()
	if ls.err != nil {
		err := ls.err
		ls.mu.Unlock()
		cancel(err)
		return ctx, func() { cancel(context.Canceled) }
	}
	if ls.watchers == nil {
		ls.watchers = make(map[int]func(error))
	}
	id := ls.nextWatch
	ls.nextWatch++
	ls.watchers[id] = cancel
	ls.mu.Unlock()
	return ctx, func() {
		ls.mu.Lock()
		delete(ls.watchers, id)
		ls.mu.Unlock()
		cancel(context.Canceled)
	}
}

// Unlock releases the lease (gocron.Lock), even if ctx is cancelled, within
// its Locker's (or JobLocker's) timeout. Its error wraps ErrLost when the
// lease was lost or a later lease owns the key, whose row it leaves as is;
// failures are logged and given to the hooks too. See docs/GUIDE.md,
// "Lease.Unlock".
func (ls *Lease) Unlock(ctx context.Context) error {
	mustContext(ctx, "Unlock")
	ctx, cancel := context.WithTimeout(driver.Uncancelled(ctx), ls.terms.timeout)
	defer cancel()
	return ls.locker.release(ctx, ls, ErrReleased)
}

// lostErr is the loss that ended the lease, or nil.
func (ls *Lease) lostErr() error {
	ls.checkTrust(time.Now())
	ls.mu.Lock()
	defer ls.mu.Unlock()
	return ls.err
}

// maxTrustMargin caps the trust margin (see trustMargin).
const maxTrustMargin = time.Second

// trustMargin is how much sooner than the TTL a Locker stops trusting a
// lease: a tenth of the TTL, at most a second. The trust deadline,
// sent_at + TTL - margin on the local clock, then falls before the server's
// expiry as long as, over one TTL, the local clock loses less than the
// margin against the server's clock, less however late the timer that ends
// the lease fires: a local clock up to 10% slow for TTLs up to 10s, 1s per
// TTL beyond. A fast local clock only ends leases early. The package
// docs/GUIDE.md ("How it works") says which clocks.
func trustMargin(ttl time.Duration) time.Duration { return min(ttl/10, maxTrustMargin) }

// trustDeadline is the deadline of a claim or heartbeat sent at sent (a
// time.Now() value) for a lease of ttl: sent + ttl - margin on each of the
// Locker's clocks (internal/trust). Each lease counts its own TTL
// (Locker.Job): a job's short lease must not be trusted for the Locker's
// longer one.
func (l *Locker) trustDeadline(sent time.Time, ttl time.Duration) trust.Deadline {
	return l.clock.Deadline(sent, ttl-trustMargin(ttl))
}

// minWatch is the shortest slice the watchdog sleeps (see watchSlice).
const minWatch = 10 * time.Millisecond

// watchSlice is how often the watchdog (trust.Watchdog: it ends a lease
// whose timer slept through a suspend within one slice of the resume)
// checks every held lease: the trust margin of the shortest TTL the Locker
// hands out (Locker.shortestTTL), at least minWatch. One timer per Locker.
func watchSlice(ttl time.Duration) time.Duration { return max(trustMargin(ttl), minWatch) }

// newWatchdog is the Locker's watchdog: every slice of its shortest TTL
// (watchSlice) it checks the trust of every held lease, and it sleeps again
// while any is held and the Locker is open.
func (l *Locker) newWatchdog() *trust.Watchdog {
	return &trust.Watchdog{
		Slice: func() time.Duration { return watchSlice(l.shortestTTL()) },
		Check: func() {
			now := time.Now()
			for _, ls := range l.reg.all() {
				ls.checkTrust(now)
			}
		},
		Keep: l.reg.any,
	}
}

// watch starts the watchdog unless it runs: Claim calls it once the lease
// is registered. It must not be called with a lease's mu held.
func (l *Locker) watch() {
	if !l.reg.isClosed() {
		l.watchdog.Start()
	}
}

// checkTrust ends the lease once its local trust deadline has passed on
// either clock: past it, the server may already have let another holder in.
func (ls *Lease) checkTrust(now time.Time) {
	ls.mu.Lock()
	untrusted := ls.err == nil && ls.trustUntil.Left(now) <= 0
	ls.mu.Unlock()
	if untrusted {
		why := "trust deadline passed without a successful heartbeat"
		ls.mu.Lock()
		skipped := ls.skippedSince
		ls.mu.Unlock()
		if !skipped.IsZero() {
			why += fmt.Sprintf(": its row has been locked by another transaction since a heartbeat %v ago", time.Since(skipped).Round(time.Millisecond))
		}
		for _, cause := range []string{ls.locker.round.cause(), ls.locker.conns.Cause()} {
			// A round that failed for want of a connection says that
			// failure already: it is said once.
			if cause != "" && !strings.Contains(why, strings.TrimPrefix(cause, "the heartbeat ")) {
				why += ": " + cause
			}
		}
		ls.lose(why)
	}
}

// trust sets the trust deadline from the send time of the last successful
// claim or heartbeat, and arms the timer that ends the lease at it. The
// timer, not the heartbeat goroutine, ends the lease: the heartbeat may be
// waiting behind a release that hangs on an unreachable database. (The
// timer runs on the monotonic clock; the watchdog covers a wall clock that
// jumps past the deadline.)
func (ls *Lease) trust(sent time.Time) {
	ls.trustUntil = ls.locker.trustDeadline(sent, ls.terms.ttl)
	wait := ls.trustUntil.Left(time.Now())
	if ls.trustTimer == nil {
		ls.trustTimer = time.AfterFunc(wait, func() { ls.checkTrust(time.Now()) })
	} else {
		ls.trustTimer.Reset(wait)
	}
}

// skipped records that a heartbeat round sent at sent found the lease's row
// locked by another transaction.
func (ls *Lease) skipped(sent time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.skippedSince.IsZero() {
		ls.skippedSince = sent
	}
}

// extend records a successful heartbeat sent at sent.
func (ls *Lease) extend(expiresAt, sent time.Time) {
	ls.mu.Lock()
	defer ls.mu.Unlock()
	if ls.err == nil {
		ls.expiresAt, ls.skippedSince = expiresAt, time.Time{}
		ls.trust(sent)
	}
}

// lose ends the lease as lost, and reports it, unless it has ended already.
func (ls *Lease) lose(why string) { ls.loseTo(why, ErrLost) }

// end moves the lease to its final state once: it records err, cancels the
// contexts of Context, reports the end (report, if not nil), drops the
// lease from its Locker and, last, closes Done, so that whoever sees Done
// closed also finds those contexts ended and the loss reported.
func (ls *Lease) end(err error, report func()) bool {
	ls.mu.Lock()
	if ls.err != nil {
		ls.mu.Unlock()
		return false
	}
	ls.err = err
	if ls.trustTimer != nil {
		ls.trustTimer.Stop()
	}
	watchers := ls.watchers
	ls.watchers = nil
	ls.mu.Unlock()

	for _, cancel := range watchers {
		cancel(err)
	}
	if report != nil {
		report() // before Done: whoever sees Done closed finds the loss reported
	}
	ls.locker.reg.remove(ls)
	ls.mu.Lock()
	ls.ended = true
	if ls.done != nil {
		close(ls.done)
	}
	ls.mu.Unlock()
	return true
}

// loss is why a lease's row no longer matched it, as a read of the row
// after the fact tells: the words of its error, and its sentinel (ErrLost,
// or ErrRevoked, which is ErrLost too).
type loss struct {
	why      string
	sentinel error
}

// lossUnknown is the loss of a lease whose row was not found, or read as
// neither taken nor ended (a Guard whose transaction sees another table
// by the name); a read that failed says so.
var lossUnknown = loss{"its row taken by a later lease or lapsed", ErrLost}

// lossesOf reads why each lease among leases that a heartbeat round, a
// release or a Guard found gone (gone, by index) no longer matches its
// row, and reports by index:
//
//   - revoked: the row's holder is sqlstmt.RevokedHolder and its fence the lease's
//     own (any fence, on a table without one);
//   - taken: another holder or fence is in the row, a later lease;
//   - expired early: the row is still the lease's, and expired before the
//     expiry the lease was last given (Admin.ForceExpire, or `pglease
//     release`): nothing else shortens a live lease's row;
//   - lapsed: the row is still the lease's, expired at or after that
//     expiry, and nobody has claimed it since.
//
// It sends nothing when no lease is gone; a lease whose row the read did
// not tell reads as lossUnknown, which it still is.
func (l *Locker) lossesOf(ctx context.Context, db DB, leases []*Lease, gone func(int) bool) map[int]loss {
	var (
		keys []string
		out  map[int]loss // nil, a map to read only, when no lease is gone
	)
	for i, ls := range leases {
		if gone(i) {
			if out == nil {
				out = make(map[int]loss)
			}
			keys = append(keys, ls.key)
			out[i] = lossUnknown
		}
	}
	if len(keys) == 0 {
		return out
	}
	t, err := driver.ParseTable(l.cfg.table)
	if err != nil {
		return out
	}
	found, err := driver.LostRows(ctx, db, t, keys)
	for i := range out {
		ls := leases[i]
		r, ok := found[ls.key]
		if err != nil {
			out[i] = loss{"its row taken by a later lease, revoked or lapsed (reading which failed: " + err.Error() + ")", ErrLost}
		}
		if !ok {
			continue
		}
		// Without a fence column (WithoutFenceColumn) the forged holder
		// is the lease: any fence matches.
		ownFence := l.cfg.noFence || r.Fence == nil || *r.Fence == ls.fence
		switch {
		case r.Holder == sqlstmt.RevokedHolder && ownFence:
			out[i] = loss{"its row's holder is the revoke marker " + sqlstmt.RevokedHolder, ErrRevoked}
		case r.Holder != ls.holder || !ownFence:
			later := "holder " + r.Holder
			if r.Fence != nil {
				later += fmt.Sprintf(", fence %d", *r.Fence)
			}
			out[i] = loss{"its row taken by a later lease (" + later + ")", ErrLost}
		case r.Live:
			// Still this lease's and live: not gone from this table.
		case r.ExpiresAt.Before(ls.ExpiresAt()):
			out[i] = loss{"its row expired early by an operator (Admin.ForceExpire)", ErrLost}
		default:
			out[i] = loss{"its row lapsed: no heartbeat extended it in time, and no later lease has claimed it", ErrLost}
		}
	}
	return out
}

// lostInRound ends ls, which a heartbeat round found gone, for the reason
// lossesOf read.
func (ls *Lease) lostInRound(why loss) {
	ls.loseTo("heartbeat found "+why.why, why.sentinel)
}

// loseTo is lose with the sentinel the error wraps: ErrLost, or ErrRevoked
// (which is ErrLost too).
func (ls *Lease) loseTo(why string, sentinel error) {
	err := fmt.Errorf("pglease: lease %q fence %d: %s: %w", ls.key, ls.fence, why, sentinel)
	ls.end(err, func() {
		ls.locker.cfg.emit(Event{Kind: EventLost, Key: ls.key, Holder: ls.holder, Fence: ls.fence, Err: err})
	})
}

// goneOnRelease is a release's outcome for a row gone, as lossesOf read.
func goneOnRelease(why loss) error { return fmt.Errorf("%s: %w", why.why, why.sentinel) }

// Leases returns a snapshot of the leases this Locker holds now (Held's
// view), sorted by key. It sends nothing to the database.
func (l *Locker) Leases() []LeaseInfo {
	now := time.Now()
	retrying := l.round.failing()
	var out []LeaseInfo
	for _, ls := range l.reg.all() {
		ls.checkTrust(now)
		ls.mu.Lock()
		held := ls.err == nil
		info := LeaseInfo{
			Key:        ls.key,
			Holder:     ls.holder,
			Fence:      ls.fence,
			AcquiredAt: ls.acquiredAt,
			ExpiresAt:  ls.expiresAt,
			Live:       true,
			TrustUntil: now.Add(ls.trustUntil.Left(now)),
			State:      "confirmed",
		}
		switch {
		case retrying:
			info.State = "retrying"
		case !ls.skippedSince.IsZero():
			info.State = "row_locked"
		}
		ls.mu.Unlock()
		if held {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b LeaseInfo) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// row is ls as the heartbeat and release statements match its row.
func (ls *Lease) row() driver.Lease {
	m := driver.Lease{Key: ls.key, Fence: ls.fence, Holder: ls.holder, AcquiredAt: ls.acquiredAt, TTL: ls.terms.ttl, MinHold: ls.terms.minHold}
	switch {
	case ls.terms.ticks == nil:
	case ls.givenBack:
		m.Run = driver.RunGivenBack
	case ls.failed.Load():
		m.Run = driver.RunFailed
	default:
		m.Run = driver.RunCompleted
	}
	return m
}

// rowsOf is each of leases as the statements match its row.
func rowsOf(leases []*Lease) []driver.Lease {
	ms := make([]driver.Lease, len(leases))
	for i, ls := range leases {
		ms[i] = ls.row()
	}
	return ms
}
