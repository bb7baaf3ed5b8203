package pglease

import (
	"context"
	"errors"
	"math"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/skew"
)

// ShiftWallClock makes l's wall clock read d later than the real one from
// now on (earlier for a negative d), while its monotonic clock runs on
// unchanged: what a Locker sees after its host was suspended for d, or after
// a step of the system clock. Other Lockers are not affected.
func ShiftWallClock(l *Locker, d time.Duration) { l.clock.Shift(d) }

// SetCoalesceAll makes every claim and release of l, even one alone, go
// through the burst's statements (sqlstmt.ClaimAll, sqlstmt.Release), so
// that the contract tests cover them too: l's protocol is wrapped in
// inBursts (off: unwrapped). Call it before l's first claim. The tests'
// TestMain sets it on every Locker pgtest builds when PGLEASE_COALESCE_ALL
// is set.
func SetCoalesceAll(l *Locker, on bool) {
	b, wrapped := l.proto.(inBursts)
	switch {
	case on && !wrapped:
		l.proto = inBursts{l.proto}
	case !on && wrapped:
		l.proto = b.Protocol
	}
}

// inBursts is a protocol whose claim and release of one lease are its
// burst's statements, as a Locker sends them for a burst: a claim that may
// wait on its row's lock without bound waits as a burst of one does
// (aloneLockWait), and is then sent alone, as a Locker sends again alone
// a claim whose row a burst found locked.
type inBursts struct{ driver.Protocol }

func (p inBursts) Claim(ctx context.Context, db driver.DB, key string, ttl, lockWait time.Duration) (driver.Claimed, bool, error) {
	if !p.Bursts() {
		return p.Protocol.Claim(ctx, db, key, ttl, lockWait)
	}
	wait := lockWait
	if wait == 0 {
		wait = aloneLockWait(ttl)
	}
	got, err := p.ClaimAll(ctx, db, []string{key}, []float64{ttl.Seconds()}, wait)
	if lockWait == 0 && driver.Is(err, driver.LockNotAvailable) {
		return p.Protocol.Claim(ctx, db, key, ttl, 0)
	}
	c, ok := got[key]
	return c, ok && err == nil, err // as Claim: a failed statement took nothing the caller may trust
}

func (p inBursts) ReleaseOne(ctx context.Context, db driver.DB, m driver.Lease) (map[int]bool, error) {
	return p.Release(ctx, db, []driver.Lease{m})
}

// SetElectorCoalesceAll is SetCoalesceAll for the Locker of e. Call it
// before e's first campaign.
func SetElectorCoalesceAll(e *Elector, on bool) { SetCoalesceAll(e.locker, on) }

// ClaimBurst claims keys on l from one goroutine each and makes every
// claim that can share a statement go out in one: l's claims queue until
// each distinct key's claim is waiting, then leave together. A second
// claim of a key waits for the first, as it always does, and goes in a
// later statement. The claims queue in the order of keys, so that the
// statement's rows come in that order unless it orders them itself. l must
// have no claim in flight. It returns each claim's outcome, in the order of
// keys.
func ClaimBurst(ctx context.Context, l *Locker, keys []string) ([]*Lease, []error) {
	return PrepareClaimBurst(contexts(ctx, len(keys)), l, keys)()
}

// contexts is n times ctx.
func contexts(ctx context.Context, n int) []context.Context {
	ctxs := make([]context.Context, n)
	for i := range ctxs {
		ctxs[i] = ctx
	}
	return ctxs
}

// ClaimBurstEach is ClaimBurst with a context of its own for each claim.
func ClaimBurstEach(ctxs []context.Context, l *Locker, keys []string) ([]*Lease, []error) {
	return PrepareClaimBurst(ctxs, l, keys)()
}

// PrepareClaimBurst queues the claims of ClaimBurstEach, and returns the
// function that sends them and waits for their outcomes: tests send the
// bursts of several Lockers at the same instant.
func PrepareClaimBurst(ctxs []context.Context, l *Locker, keys []string) (send func() ([]*Lease, []error)) {
	return prepareBurst(ctxs, l, keys, func(_ int, ctx context.Context, key string) (*Lease, error) { return l.Claim(ctx, key) })
}

// prepareBurst is PrepareClaimBurst with claim(i, ctxs[i], keys[i]) making
// the claim of keys[i]: a claim of l, or of one of its JobLockers.
func prepareBurst(ctxs []context.Context, l *Locker, keys []string,
	claim func(i int, ctx context.Context, key string) (*Lease, error),
) (send func() ([]*Lease, []error)) {
	c := l.claims
	// Other claims of l may queue too: a signal that finds the buffer full
	// is not needed (the buffer holds as many as there are keys), and must
	// not block the coalescer, whose lock onQueue is called with.
	queued := make(chan struct{}, len(keys))
	c.Hold(func() {
		select {
		case queued <- struct{}{}:
		default:
		}
	})
	leases, errs := make([]*Lease, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	seen := map[string]bool{}
	for i, key := range keys {
		wg.Add(1)
		returned := make(chan struct{})
		go func() {
			defer wg.Done()
			defer close(returned)
			leases[i], errs[i] = claim(i, ctxs[i], key)
		}()
		if seen[key] {
			continue // waits for the first claim of key, not in the queue
		}
		seen[key] = true
		select { // queued in the order of keys
		case <-queued:
		case <-returned: // never queued: Close came first, or it waited for a claim of its key
		case <-ctxs[i].Done():
		}
	}
	return func() ([]*Lease, []error) {
		c.Release()
		wg.Wait()
		return leases, errs
	}
}

// UnlockBurst unlocks leases (all of l) from one goroutine each, in one
// statement, as ClaimBurst claims. It returns each Unlock's outcome.
func UnlockBurst(ctx context.Context, l *Locker, leases []*Lease) []error {
	c := l.releases
	queued := make(chan struct{}, len(leases))
	c.Hold(func() { queued <- struct{}{} })
	errs := make([]error, len(leases))
	var wg sync.WaitGroup
	for i, ls := range leases {
		wg.Add(1)
		go func() {
			defer wg.Done()
			errs[i] = ls.Unlock(ctx)
		}()
	}
	for range leases {
		select {
		case <-queued:
		case <-ctx.Done():
		}
	}
	c.Release()
	wg.Wait()
	return errs
}

// SetCoalescing turns l's coalescing of claims and releases off (or back
// on): every claim and release then has a statement of its own, as before
// coalescing existed. Benchmarks compare the two. Call it before l's first
// claim.
func SetCoalescing(l *Locker, on bool) {
	if on {
		l.claims, l.releases = l.newClaims(), l.newReleases()
		return
	}
	l.claims, l.releases = nil, nil
}

// StoredHolder makes a Locker store holder as it is, without a suffix of
// its own: as the previous version stored WithHolder(holder) (the
// statements are the same in both versions, only the holder they carry
// differs), or sharing another Locker's Holder, whose leases it then takes
// as its own re-entrant claims, as a claim of that Locker whose reply was
// lost would.
func StoredHolder(holder string) Option {
	return Option{"StoredHolder", atLocker, lockerWide, func(c *config) { c.holder = holder }}
}

// CheckTable makes l's one read of its table now, as its first claim would,
// for tests that time that claim's statement alone.
func (l *Locker) CheckTable(ctx context.Context) error { return l.table.check(ctx) }

// RecheckTableEvery makes a check of l's table that passed stand for d
// (tableRecheck) instead: call it before l's first claim.
func (l *Locker) RecheckTableEvery(d time.Duration) { l.table.every = d }

// TableRecheck is how long a check of the table that passed stands.
const TableRecheck = tableRecheck

// New is NewLocker returning its error instead of panicking with it, for
// the tests that check that error.
func New(db DB, opts ...Option) (*Locker, error) { return newLocker(db, opts...) }

// MaxPollInterval is the longest pause of a polling waiter.
const MaxPollInterval = maxPollInterval

// DefaultLeaderKey is the leader key the tests' Electors share.
const DefaultLeaderKey = "gocron-leader"

// WaitMode is the WaitMode of e's Locker, whose listener e shares.
func (e *Elector) WaitMode() (WaitMode, string) { return e.locker.WaitMode() }

// ErrUnnamedJob is the Err of EventUnnamedJob.
var ErrUnnamedJob = errUnnamedJob

// TTL is the lease duration j claims and the heartbeat extends.
func (j *JobLocker) TTL() time.Duration { return j.terms.ttl }

// MinHold is how long after its claim a released lease of j stays held.
func (j *JobLocker) MinHold() time.Duration { return j.terms.minHold }

// Beyond is how far the offset of s is certainly beyond zero: |Offset| -
// Uncertainty, or 0 when the reading cannot tell the clocks apart.
func (s Skew) Beyond() time.Duration { return skew.Sample(s).Beyond() }

// NewLockerOn is a Locker whose statements are those of the protocol proto
// makes for its holder (the in-memory driver of internal/driver/fakedriver),
// on no database: its table check stands as passed, and the reads it makes
// beside its protocol (the cause of a loss, a waiting claim's remaining
// time) fail as a server that does not answer them.
func NewLockerOn(proto func(holder string) driver.Protocol, opts ...Option) (*Locker, error) {
	l, err := newLocker(noDB{}, opts...)
	if err != nil {
		return nil, err
	}
	l.proto = proto(l.cfg.holder)
	passed := time.Now()
	l.table.passed.Store(&passed)
	l.table.every = time.Duration(math.MaxInt64)
	return l, nil
}

// errNoDB is what every statement on noDB returns.
var errNoDB = errors.New("no database: this Locker speaks only to its protocol")

// noDB is the DB of a Locker on a protocol of its own (NewLockerOn).
type noDB struct{}

func (noDB) Exec(context.Context, string, ...any) (pgconn.CommandTag, error) {
	return pgconn.CommandTag{}, errNoDB
}
func (noDB) Query(context.Context, string, ...any) (pgx.Rows, error) { return nil, errNoDB }
func (noDB) QueryRow(context.Context, string, ...any) pgx.Row        { return noRow{} }
func (noDB) Begin(context.Context) (pgx.Tx, error)                   { return nil, errNoDB }

type noRow struct{}

func (noRow) Scan(...any) error { return errNoDB }

// WaitMode is how a Locker's waiting claims wake up (waitMode); the
// tests read it where a user watches EventWaitByNotification and
// EventWaitByPolling.
type WaitMode = waitMode

const (
	WaitIdle           = waitIdle
	WaitByNotification = waitByNotification
	WaitByPolling      = waitByPolling
)

// WaitMode is how l's waiting claims wake up now, and why when they poll.
func (l *Locker) WaitMode() (WaitMode, string) { return l.waitMode() }

// MaxKeyLen is the longest key, in bytes, that Claim accepts.
const MaxKeyLen = keys.MaxLen

// OptionNamed is the option an error of an invalid option names, or "" when
// err is none.
func OptionNamed(err error) string {
	var oe *optionError
	if errors.As(err, &oe) {
		return oe.option
	}
	return ""
}

// NeverSent reports whether err, a statement's failure, says the statement
// never left the client (it had no connection in time).
func NeverSent(err error) bool { return driver.OutcomeOf(err) == driver.NotSent }
