package pglease

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// pooler is a pool pglease takes connections from itself: *pgxpool.Pool.
type pooler interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Stat() *pgxpool.Stat
}

// conns hands out the connections a Locker's statements run on.
//
// On a pool shared with the application's jobs, jobs that hold every
// connection past the trust window make every lease lost while the
// database is fine: the heartbeat waits in the pool's queue behind them.
// Every wait for a pool connection is therefore timed on its own, so that a
// failure says "waited 4.9s for a connection from the pool (10 of 10 in
// use)" instead of looking like a database failure, and a lease lost while
// the heartbeat waits says so.
//
// With WithKeptConnection, a Locker on a *pgxpool.Pool (of two connections
// or more) also keeps one of them, the reserve, from its first claim until
// Close: the connection of that claim, never handed back in between, so no
// job can take it. Heartbeat rounds run on it, and so do releases while it
// is free. A broken reserve is dropped and the next round takes a new
// connection from the pool. It is not the default because pgxpool's Close
// waits for every connection taken from it: a pool closed before its
// Locker would hang.
//
// Any other DB (a *pgx.Conn, a wrapper) is used as given.
type conns struct {
	db      DB
	pool    pooler // db as a pool, or nil
	reserve bool   // keep one connection of pool

	claim, heartbeat, release DB // the DB each kind of statement runs on

	slot   chan struct{} // holds the reserve while a statement uses it
	single chan struct{} // held by the statement in flight on a DB that is not a pool
	// claims bounds the pool connections claims hold at once to all but
	// one: a claim may wait on a row lock for as long as it is held, and
	// claims of many locked rows must never take every connection, or the
	// heartbeat would wait behind them until every lease is lost.
	claims chan struct{}

	mu        sync.Mutex
	held      *pgxpool.Conn // the reserve; nil until the first claim, once broken, and after close
	idleSince time.Time     // when the reserve was last put back
	closed    bool
	waitSince time.Time // when the heartbeat started waiting for a pool connection; zero when not waiting
	starved   error     // the heartbeat's last wait for a pool connection, if it failed
}

// maxIdleUnchecked is how long the reserve may idle before it is checked
// with a ping before its next use, as pgxpool checks its own connections.
const maxIdleUnchecked = time.Second

type use int

const (
	useClaim     use = iota // a pool connection, kept as the reserve when there is none
	useHeartbeat            // the reserve, taken from the pool when there is none
	useRelease              // the reserve when free, else a pool connection
)

func newConns(db DB, keep bool) *conns {
	c := &conns{db: db, slot: make(chan struct{}, 1), single: make(chan struct{}, 1)}
	if p, ok := db.(pooler); ok {
		c.pool = p
		c.reserve = keep // NewLocker refuses it for a pool of one, which would leave claims nothing
		c.claims = make(chan struct{}, claimConns(p.Stat().MaxConns()))
	}
	c.claim, c.heartbeat, c.release = connDB{c, useClaim}, connDB{c, useHeartbeat}, connDB{c, useRelease}
	return c
}

// claimConns is how many connections of a pool of size claims may hold at
// once: all but one, and at least one.
func claimConns(size int32) int { return max(1, int(size)-1) }

// claimLimit is how many claim statements a Locker sends at once before it
// makes the next ones wait and go together: maxAloneInFlight, or fewer on a
// pool that could not serve that many and the heartbeat.
func (c *conns) claimLimit() int {
	if c.claims == nil {
		return maxAloneInFlight
	}
	return min(maxAloneInFlight, cap(c.claims))
}

// notSentError is the failure of a statement that never left the client:
// no connection could be had for it.
type notSentError struct{ err error }

func (e notSentError) Error() string { return e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// take returns the DB one statement of kind u runs on, and what to call once
// the statement is done. Its errors are notSentError: the statement was
// not sent.
func (c *conns) take(ctx context.Context, u use) (DB, func(), error) {
	if u == useClaim && c.claims != nil {
		select {
		case c.claims <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, notSentError{fmt.Errorf("waiting for one of the %d pool connections claims may hold at once (one is kept free for the heartbeat): %w", cap(c.claims), context.Cause(ctx))}
		}
		db, done, err := c.takeFor(ctx, u)
		if err != nil {
			<-c.claims
			return nil, nil, err
		}
		return db, func() { done(); <-c.claims }, nil
	}
	return c.takeFor(ctx, u)
}

// takeFor is take without the bound on claims.
func (c *conns) takeFor(ctx context.Context, u use) (DB, func(), error) {
	db, done, err := c.takeConn(ctx, u)
	if err != nil {
		return nil, nil, notSentError{err}
	}
	return db, done, nil
}

// takeConn is takeFor, its errors unmarked.
func (c *conns) takeConn(ctx context.Context, u use) (DB, func(), error) {
	if c.pool == nil {
		// One connection (a *pgx.Conn) serves one statement at a time: the
		// heartbeat and the callers' claims and releases take turns, or
		// they would collide on it ("conn busy") and race in its statement
		// cache. A wrapper that is a pool of its own is serialized too:
		// correct, if slower.
		select {
		case c.single <- struct{}{}:
		case <-ctx.Done():
			return nil, nil, fmt.Errorf("waiting for the connection, busy with another statement of this Locker: %w", context.Cause(ctx))
		}
		return c.db, func() { <-c.single }, nil
	}
	if c.reserve {
		switch u {
		case useHeartbeat:
			select {
			case c.slot <- struct{}{}:
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("waiting for the connection kept for the heartbeat: %w", context.Cause(ctx))
			}
			return c.takeReserve(ctx, u)
		case useRelease:
			select {
			case c.slot <- struct{}{}:
				return c.takeReserve(ctx, u)
			default: // another release has it
			}
		}
	}
	conn, err := c.acquire(ctx, u == useHeartbeat)
	if err != nil {
		return nil, nil, err
	}
	if u == useClaim && c.reserve {
		return conn, func() { c.keep(conn) }, nil
	}
	return conn, conn.Release, nil
}

// takeReserve returns the reserve, taken from the pool if there is none; the
// caller holds the slot.
func (c *conns) takeReserve(ctx context.Context, u use) (DB, func(), error) {
	c.mu.Lock()
	conn, idle := c.held, time.Since(c.idleSince)
	c.mu.Unlock()
	if conn != nil && idle > maxIdleUnchecked && conn.Ping(ctx) != nil {
		// Closed while it idled (idle_session_timeout, a firewall, a
		// pooler, a restart): pgxpool would not have handed it out either.
		c.mu.Lock()
		if c.held == conn {
			c.held = nil
		}
		c.mu.Unlock()
		conn.Release() // pgxpool destroys a broken connection
		conn = nil
	}
	if conn == nil {
		var err error
		if conn, err = c.acquire(ctx, u == useHeartbeat); err != nil {
			<-c.slot
			return nil, nil, err
		}
		c.hold(conn)
	}
	return conn, func() { c.putBack(conn) }, nil
}

// hold makes conn the reserve; the caller holds the slot.
func (c *conns) hold(conn *pgxpool.Conn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return // put back and released by putBack
	}
	c.held = conn
}

// putBack ends a statement on the reserve: a broken one is dropped, and
// after close it goes back to the pool.
func (c *conns) putBack(conn *pgxpool.Conn) {
	c.mu.Lock()
	if broken(conn) || c.closed {
		if c.held == conn {
			c.held = nil
		}
		conn.Release() // pgxpool destroys a broken connection
	}
	c.idleSince = time.Now()
	c.mu.Unlock()
	<-c.slot
}

// keep ends a claim's statement: its connection becomes the reserve if
// there is none, and goes back to the pool otherwise.
func (c *conns) keep(conn *pgxpool.Conn) {
	select {
	case c.slot <- struct{}{}:
	default:
		conn.Release()
		return
	}
	c.mu.Lock()
	if c.held == nil && !c.closed && !broken(conn) {
		c.held, conn, c.idleSince = conn, nil, time.Now()
	}
	c.mu.Unlock()
	<-c.slot
	if conn != nil {
		conn.Release()
	}
}

// close gives the reserve back to the pool, now if it is free, or else as
// soon as the statement using it ends.
func (c *conns) close() {
	c.mu.Lock()
	c.closed = true
	c.mu.Unlock()
	select {
	case c.slot <- struct{}{}:
	default:
		return // putBack releases it
	}
	c.mu.Lock()
	conn := c.held
	c.held = nil
	c.mu.Unlock()
	<-c.slot
	if conn != nil {
		conn.Release()
	}
}

func broken(conn *pgxpool.Conn) bool {
	pc := conn.Conn().PgConn()
	return pc.IsClosed() || pc.IsBusy() || pc.TxStatus() != 'I'
}

// acquire takes a connection from the pool, timing the wait so that a
// failure names it. A wait of the heartbeat is recorded for cause.
func (c *conns) acquire(ctx context.Context, heartbeat bool) (*pgxpool.Conn, error) {
	start := time.Now()
	if heartbeat {
		c.mu.Lock()
		c.waitSince = start
		c.mu.Unlock()
	}
	conn, err := c.pool.Acquire(ctx)
	if err != nil {
		err = fmt.Errorf("waited %v for a connection from the pool (%s): %w", time.Since(start).Round(time.Millisecond), c.inUse(), err)
	}
	if heartbeat {
		c.mu.Lock()
		c.waitSince, c.starved = time.Time{}, err
		c.mu.Unlock()
	}
	return conn, err
}

func (c *conns) inUse() string {
	st := c.pool.Stat()
	return fmt.Sprintf("%d of %d in use", st.AcquiredConns(), st.MaxConns())
}

// cause says why the heartbeat has had no connection, if it is waiting for
// one from the pool or its last wait failed; empty otherwise.
func (c *conns) cause() string {
	c.mu.Lock()
	since, starved := c.waitSince, c.starved
	c.mu.Unlock()
	switch {
	case !since.IsZero():
		return fmt.Sprintf("the heartbeat has waited %v for a connection from the pool (%s)", time.Since(since).Round(time.Millisecond), c.inUse())
	case starved != nil:
		return "the heartbeat " + starved.Error()
	}
	return ""
}

// connDB is the DB of one kind of statement: each call takes a connection
// for that statement and gives it back once done (for Query, once the rows
// are closed; for QueryRow, once scanned). Begin, which no statement of the
// protocol uses, goes to the DB as given.
type connDB struct {
	c *conns
	u use
}

func (d connDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer done()
	return db.Exec(ctx, sql, args...)
}

func (d connDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		done()
		return nil, err
	}
	return &doneRows{Rows: rows, done: done}, nil
}

func (d connDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return errRow{err}
	}
	return doneRow{row: db.QueryRow(ctx, sql, args...), done: done}
}

func (d connDB) Begin(ctx context.Context) (pgx.Tx, error) { return d.c.db.Begin(ctx) }

// doneRows gives the connection back when the rows are closed.
type doneRows struct {
	pgx.Rows
	done func()
	once sync.Once
}

func (r *doneRows) Close() {
	r.Rows.Close()
	r.once.Do(r.done)
}

// doneRow gives the connection back once scanned.
type doneRow struct {
	row  pgx.Row
	done func()
}

func (r doneRow) Scan(dest ...any) error {
	defer r.done()
	return r.row.Scan(dest...)
}

// errRow is a row that failed before its statement was sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
