package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/coalesce"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/flight"
	"github.com/pglease/pglease/internal/gate"
	"github.com/pglease/pglease/internal/holder"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/skew"
	"github.com/pglease/pglease/internal/trust"
	"github.com/pglease/pglease/internal/turn"
)

// DB is what pglease needs from PostgreSQL; *pgxpool.Pool and *pgx.Conn
// satisfy it. pglease never closes it. See docs/GUIDE.md, "DB".
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// SQL returns a DB on db, a database/sql pool of pgx's stdlib driver ("pgx")
// or lib/pq ("postgres"). A Locker keeps one of db's connections for its
// heartbeat (a limit of one is refused), and its waiting claims poll unless
// WithListenDSN is given. See docs/GUIDE.md, "SQL".
func SQL(db *sql.DB) DB {
	if db == nil {
		return nil
	}
	return driver.NewSQLDB(db)
}

var _ DB = (*driver.SQLDB)(nil)

var _ gocron.Locker = (*Locker)(nil)

// Locker claims leases on one table for one holder and keeps them alive
// with a heartbeat goroutine (and, once a claim waits, a listener), started by the first claim
// and stopped by Close. It is safe for concurrent use.
type Locker struct {
	cfg config

	proto driver.Protocol // the statements, with or without the fence column
	conns *driver.Conns   // the connections they run on

	// gate lets a heartbeat round run alone and releases together, so that
	// a heartbeat already in flight can never re-arm a lease that Unlock has
	// just released.
	gate gate.Gate
	// round says what the heartbeat is doing, for the cause of a loss.
	round roundState

	// turns lets one claim of a key run at a time, so that the lease
	// registered last is the one committed last (see internal/turn).
	turns turn.Turns[string]

	// claims and releases send the claims and releases that arrive while
	// another of their statements is in flight together, in one (see
	// internal/coalesce); claims is nil when the protocol sends them one by
	// one.
	claims   *coalesce.Coalescer[claimCall, claimOutcome]
	releases *coalesce.Coalescer[releasing, releaseResult]

	reg     registry      // its leases, releases, fences, Electors and heartbeat, behind one mutex (registry.go)
	closing chan struct{} // closed when Close has finished
	closed  error         // the first Close's error, once closing is closed

	skew  skew.Filter // the clock-skew reading, from claims and heartbeat rounds
	waits waiting     // waiting claims and their listener (wait.go)

	// watchdog checks every lease's trust while any is held (Locker.watch);
	// its lock is taken before the registry's.
	watchdog *trust.Watchdog
	// clock is the Locker's wall clock, for trust deadlines and the
	// clock-skew reading (tests shift it, export_test.go).
	clock trust.Clock

	// inFlight counts the claims on their way (Claim, Lock, ClaimWait):
	// Close ends them and waits for them.
	inFlight flight.Flights
	// table is the check of the table before claims (table.go).
	table tableCheck
	beat  func(ctx context.Context, done chan<- struct{}) // l.heartbeat, for the first lease to start: made once

	minTTL atomic.Int64 // the shortest TTL of the Locker and its jobs (Locker.Job)
	// drawn is the greatest fence this Locker's claims have drawn: a claim
	// sent later draws a greater one, unless the fence sequence went
	// backwards (driver.Table.DrewBackwards).
	drawn atomic.Int64
	// minHold is the shortest min hold above 0 of the Locker and its jobs,
	// or 0 when none has one: the clock-skew warning's bound (skew.Bound).
	minHold atomic.Int64
}

// NewLocker returns a Locker on db. It panics with an error naming what is
// wrong: a nil db, a pgx.Tx, or an invalid option (wrapping ErrInvalidOption). Every
// statement of a Locker commits on its own: a *pgx.Conn must not be in a
// transaction either. It sends nothing to the database.
func NewLocker(db DB, opts ...Option) *Locker {
	l, err := newLocker(db, opts...)
	if err != nil {
		panic(err)
	}
	return l
}

// newLocker is NewLocker returning its error.
func newLocker(db DB, opts ...Option) (*Locker, error) {
	if isNil(db) {
		return nil, errors.New("pglease: new locker: db is nil")
	}
	if _, ok := db.(pgx.Tx); ok {
		// A claim would then commit only when the caller's transaction
		// does, and a rollback would let another holder in while this
		// Locker trusts the lease; a release would also turn the caller's
		// synchronous_commit off until its commit.
		return nil, errors.New("pglease: new locker: db is a pgx.Tx: a Locker needs a pool or a connection, each statement committing on its own")
	}
	cfg, err := newConfig(opts)
	if err != nil {
		return nil, err
	}
	if cfg.keepConn {
		if p, ok := db.(driver.Pooler); !ok || p.Stat().MaxConns() < 2 {
			return nil, &optionError{option: "WithKeptConnection", msg: fmt.Sprintf(
				"WithKeptConnection does not apply to a %T: it keeps one connection of a *pgxpool.Pool of two connections or more", db)}
		}
	}
	if s, ok := db.(*driver.SQLDB); ok && s.DB().Stats().MaxOpenConnections == 1 {
		// A claim waiting on a row lock would hold the only connection, and
		// the heartbeat would wait behind it until every lease is lost.
		return nil, errors.New("pglease: new locker: the *sql.DB is limited to one connection (SetMaxOpenConns(1)): " +
			"a claim waiting on a row lock would leave the heartbeat none; allow two or more")
	}
	t, _ := driver.ParseTable(cfg.table) // checked by newConfig
	proto, use := driver.Fenced(t.Render, cfg.holder, cfg.ttl), driver.ClaimFenced
	if cfg.noFence {
		forge := func() string { return holder.Own(cfg.holder) }
		proto = driver.Unfenced(t.Render, t.String(), t.Name.Sanitize(), cfg.holder+holder.Sep, forge)
		use = driver.ClaimUnfenced
	}
	conns := driver.NewConns(db, cfg.keepConn)
	l := &Locker{
		cfg:     cfg,
		proto:   proto,
		conns:   conns,
		closing: make(chan struct{}),
		table: newTableCheck(func(ctx context.Context) error {
			return readTable(ctx, conns.Claim(), t, use)
		}),
	}
	l.minTTL.Store(int64(cfg.ttl))
	l.minHold.Store(int64(cfg.minHold))
	l.claims, l.releases = l.newClaims(), l.newReleases()
	l.watchdog = l.newWatchdog()
	l.waits.table, l.beat = t, l.heartbeat
	return l, nil
}

func isNil(db DB) bool {
	v := reflect.ValueOf(db) // the zero Value, of no kind, for a nil interface
	return db == nil || v.Kind() == reflect.Pointer && v.IsNil()
}

// Holder is the identity this Locker writes in the holder column: its
// WithHolder value, '#' and a random suffix that no other Locker has.
func (l *Locker) Holder() string { return l.cfg.holder }

// Skew is a reading of this replica's wall clock against the database's,
// from the server time that claims and heartbeats return. See docs/GUIDE.md,
// "Skew".
type Skew struct {
	// Offset is the server's clock minus this replica's: positive when the
	// server is ahead.
	Offset time.Duration
	// Uncertainty is half the sample's round trip: the true offset was
	// within Offset ± Uncertainty.
	Uncertainty time.Duration
	// At is the local wall time of the sample; zero without a reading.
	At time.Time
}

// ClockSkew returns the Locker's latest reading of its wall clock's skew
// against the database's, and false before its first successful claim.
func (l *Locker) ClockSkew() (Skew, bool) {
	s, ok := l.skew.Get()
	return Skew(s), ok
}

// recordSkew takes the sample of a claim or heartbeat round sent at sent (a
// time.Now() value) that returned the server time server after took, and
// returns the new reading, logging each crossing of skew.Bound.
func (l *Locker) recordSkew(server, sent time.Time, took time.Duration) Skew {
	minHold := time.Duration(l.minHold.Load())
	bound := skew.Bound(minHold)
	reading, up, down := l.skew.Add(skew.Measure(server, l.clock.Wall(sent), took), bound)
	skew.Warn(l.cfg.logger, l.cfg.holder, reading, up, down, bound, minHold)
	return Skew(reading)
}

// Lock implements gocron.Locker: it claims key (the job name) within the
// Locker's timeout. Failures other than contention are logged at error level
// and given to the hooks, since gocron does not report them; a key like a Go
// function name (a job without gocron.WithName) is reported as
// EventUnnamedJob.
func (l *Locker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	mustContext(ctx, "Lock")
	return l.lock(ctx, key, l.terms())
}

// lock is Lock on the given terms, the Locker's or a job's: a claim within
// their timeout.
func (l *Locker) lock(ctx context.Context, key string, t terms) (gocron.Lock, error) {
	l.warnUnnamed(key)
	cctx, cancel := context.WithTimeout(ctx, t.timeout)
	defer cancel()
	lease, err := l.claim(cctx, key, t, reentrant, flight.Call{})
	var th *tickHeldError
	if err != nil && t.ticks != nil && t.ticks.catchUpOn && errors.As(err, &th) && (th.mayLapse() || th.raced()) {
		lease, err = l.catchUp(ctx, key, t, th.tick)
	}
	if err != nil {
		return nil, err // a nil gocron.Lock, not a nil *Lease in one
	}
	return lease, nil
}

// once emits e the first time it is asked to for e's kind and key.
func (l *Locker) once(key string, e Event) {
	if l.reg.first(e.Kind.String() + "\x00" + key) {
		l.cfg.emit(e)
	}
}

// warnUnnamed reports, once per key, a key Lock was given that looks like
// a Go function name (EventUnnamedJob, at error level). The job still
// runs: refusing it would stop every unnamed job at an upgrade.
func (l *Locker) warnUnnamed(key string) {
	if keys.LooksLikeFuncName(key) {
		l.once(key, Event{Kind: EventUnnamedJob, Key: key, Err: errUnnamedJob})
	}
}

// errUnnamedJob is the Err of EventUnnamedJob: Lock's key looks like
// gocron's default job name, the Go function's name.
var errUnnamedJob = errors.New("pglease: the key looks like a Go function name, gocron's default name of a job given no gocron.WithName: " +
	"it changes when the code moves or is renamed, and two versions of a service would then run the job at once; " +
	"name the job (gocron.WithName, or Locker.Task)")

// Held returns the newest lease this Locker holds for key, if it is still
// held: not released, not lost, and within its trust deadline. A job run by
// gocron reaches its lease this way, with its job name as key.
func (l *Locker) Held(key string) (*Lease, bool) {
	lease := l.reg.get(key)
	if lease == nil || lease.Err() != nil {
		return nil, false
	}
	return lease, true
}

// mustContext panics on a nil context before anything changes: passing nil
// is a programming error in Go, and failing deep inside the driver would name
// nothing (or, in Close, leave the Locker half closed).
func mustContext(ctx context.Context, method string) {
	if ctx == nil {
		panic("pglease: " + method + ": nil Context")
	}
}

// Close closes the Locker's Electors, stops the heartbeat, releases every
// lease still held in one statement (their Err then wraps ErrClosed), even
// if ctx is cancelled, ends claims in flight with ErrClosed, and waits for
// the Locker's goroutines. When it returns nil, nothing of the Locker runs
// or is held, but for the callbacks still due of an Elector from whose
// callback it was called. A later call waits for the first and returns its
// error. See docs/GUIDE.md, "Locker.Close".
func (l *Locker) Close(ctx context.Context) error {
	mustContext(ctx, "Close")
	l.inFlight.Closing() // first: a claim that leaves from now on tells Close what it left behind
	// Give-backs go on within ctx, or once it has ended, for as long as a
	// claim Close cancels takes to end by itself, all of them together.
	electors, first := l.reg.close(ctx, time.Now().Add(closingGiveBack+l.cfg.timeout))
	if !first {
		return l.closeAgain(ctx)
	}
	errs := closeElectors(ctx, electors)
	held := l.stopClaiming()
	// The releases and the waits for what is in flight run even if ctx is
	// cancelled, bounded by the Locker's timeout.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.cfg.timeout)
	defer cancel()
	errs = append(errs, l.releaseHeld(rctx, held)...)
	errs = append(errs, l.awaitInFlight(ctx, rctx)...)
	errs = append(errs, l.closeConnections(ctx, rctx)...)
	l.closed = errors.Join(errs...)
	close(l.closing)
	return l.closed
}

// closeAgain is a Close after the first: it waits for the first, and for
// the Electors' callbacks (a first Close called from one cannot), and
// returns the first's error. Called from a callback while the first Close
// closes its Elector, which waits for that callback, it cannot wait.
func (l *Locker) closeAgain(ctx context.Context) error {
	if l.reg.calledFromElector() {
		return fmt.Errorf("pglease: close: called from an Elector's callback while the Locker's first Close closes it, "+
			"which waits for that callback: the first Close's error says what it left: %w", ErrClosed)
	}
	select {
	case <-l.closing:
	case <-ctx.Done():
		return fmt.Errorf("pglease: close: waiting for the first Close: %w", ctx.Err())
	}
	// An Elector closed from its own callback was not waited for: a later
	// Elector.Close waits for the callbacks still due.
	if errs := closeElectors(ctx, l.reg.electorsLeft()); len(errs) > 0 {
		return errors.Join(errs...)
	}
	return l.closed
}

// closeElectors closes the Locker's Electors first: each resigns, its
// campaign stops and its callbacks run, so that no goroutine of theirs
// outlives the Locker.
func closeElectors(ctx context.Context, electors map[*Elector]struct{}) []error {
	var errs []error
	for e := range electors {
		if err := e.Close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	return errs
}

// stopClaiming ends the claims in flight with ErrClosed (no new one
// starts), makes waiting claims return ErrClosed and stops the listener,
// stops the heartbeat and waits for its round in flight, and returns the
// leases held then.
func (l *Locker) stopClaiming() []*Lease {
	held := l.reg.all()
	l.inFlight.Close(ErrClosed)
	l.stopWaiting()
	if done := l.reg.stopHeartbeat(); done != nil {
		<-done
	}
	return held
}

// releaseHeld releases held together, within rctx; a lease already lost
// is no error of Close's.
func (l *Locker) releaseHeld(rctx context.Context, held []*Lease) []error {
	var errs []error
	for _, err := range l.releaseAll(rctx, held, ErrClosed) {
		if err != nil && !errors.Is(err, ErrLost) {
			errs = append(errs, err)
		}
	}
	return errs
}

// awaitInFlight waits for the claims in flight, the Unlocks that began
// before Close and the statements of both coalescers. A claim in flight
// gives back what it may have committed before it returns (settle), on
// these connections; cancelled, each ends by itself (see Close's doc):
// it is waited for within rctx, the Locker's timeout, and beyond it as
// long as ctx lasts. An Unlock that began before Close is left to it
// (releaseAll) and waited for within rctx.
func (l *Locker) awaitInFlight(ctx, rctx context.Context) []error {
	var errs []error
	err := l.inFlight.Wait(rctx)
	if err != nil && ctx.Err() == nil {
		err = l.inFlight.Wait(ctx)
	}
	if err != nil {
		errs = append(errs, fmt.Errorf("pglease: close: %w (cancelled, each ends by itself within %v plus its timeout, "+
			"or through lib/pq once the server answers or the connection fails)", err, 2*driver.AnswerGrace))
	}
	for _, done := range l.reg.releasesInFlight() {
		select {
		case <-done:
		case <-rctx.Done():
			errs = append(errs, fmt.Errorf("pglease: close: a release still in flight: %w", context.Cause(rctx)))
		}
	}
	if l.claims != nil { // nil: claims go one by one
		l.claims.Wait()
	}
	if l.releases != nil {
		l.releases.Wait()
	}
	return append(errs, l.stillLeft(rctx, append(l.inFlight.Notes(), l.reg.givenUpErrs()...))...)
}

// closeConnections stops the watchdog, gives the heartbeat's reserve back
// to the pool and waits, within rctx and then as long as ctx lasts, for
// the connections closed after a cancel request to finish closing.
func (l *Locker) closeConnections(ctx, rctx context.Context) []error {
	l.watchdog.Stop() // for good: every lease has ended
	l.conns.Close()
	err := l.conns.Closing.Wait(rctx)
	if err != nil && ctx.Err() == nil {
		err = l.conns.Closing.Wait(ctx)
	}
	if err != nil {
		return []error{fmt.Errorf("pglease: close: %w", err)}
	}
	return nil
}
