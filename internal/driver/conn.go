package driver

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// DB is what pglease sends statements on: a *pgxpool.Pool, a *pgx.Conn, a
// SQLDB, or a wrapper of the caller's. It has the methods of pglease.DB.
type DB interface {
	Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error)
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
	Begin(ctx context.Context) (pgx.Tx, error)
}

// Pooler is a pool pglease takes connections from itself: *pgxpool.Pool.
type Pooler interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
	Stat() *pgxpool.Stat
}

// connPool is a pool Conns takes one connection from per statement: a
// *pgxpool.Pool (pgxPool) or a database/sql pool (sqlPool).
type connPool interface {
	get(ctx context.Context) (PoolConn, error)
	// stat is the pool's connections in use, those being opened, and its
	// size; a size of 0 is a pool without a limit.
	stat() (inUse, opening, size int)
}

// PoolConn is one connection of a pool, taken for one statement or kept
// as the reserve.
type PoolConn interface {
	DB
	Release() // back to the pool, which destroys a broken one
	broken() bool
	ping(ctx context.Context) error
}

var (
	_ connPool = pgxPool{}
	_ PoolConn = pgxConn{}
	_ connPool = sqlPool{}
	_ PoolConn = sqlConn{}
)

// pgxPool is a *pgxpool.Pool as a connPool.
type pgxPool struct{ p Pooler }

func (p pgxPool) get(ctx context.Context) (PoolConn, error) {
	conn, err := p.p.Acquire(NoDeadline(ctx))
	if err != nil {
		return nil, err
	}
	return pgxConn{conn}, nil
}

// NoDeadline is ctx without its deadline: it ends when ctx does, but has
// none to give. pgxpool pings a connection that idled under the deadline
// of the context Acquire was given and, when that context ends first,
// gives the connection back to the pool once the ping returns: a cancel
// request pgx sent for the ping at that deadline (with
// pgconn.CancelRequestContextWatcherHandler) would then be on its way to
// the connection's next statement, a claim among them. Without a deadline,
// that ping is never cancelled. A ctx with no deadline is returned as is.
func NoDeadline(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok {
		return ctx
	}
	return noDeadline{ctx}
}

type noDeadline struct{ context.Context }

// Uncancelled is context.WithoutCancel(ctx), or ctx itself when it has
// neither a deadline nor an end: one allocation fewer on every Unlock
// given such a context.
func Uncancelled(ctx context.Context) context.Context {
	if _, ok := ctx.Deadline(); !ok && ctx.Done() == nil {
		return ctx
	}
	return context.WithoutCancel(ctx)
}

func (noDeadline) Deadline() (time.Time, bool) { return time.Time{}, false }

func (p pgxPool) stat() (int, int, int) {
	st := p.p.Stat()
	return int(st.AcquiredConns()), int(st.ConstructingConns()), int(st.MaxConns())
}

// pgxConn is a connection of a pgxPool.
type pgxConn struct{ *pgxpool.Conn }

func (c pgxConn) ping(ctx context.Context) error { return c.Ping(ctx) }

func (c pgxConn) broken() bool {
	pc := c.Conn.Conn().PgConn()
	return pc.IsClosed() || pc.IsBusy() || pc.TxStatus() != 'I'
}

// sqlPool is a SQLDB as a connPool.
type sqlPool struct{ d *SQLDB }

func (p sqlPool) get(ctx context.Context) (PoolConn, error) {
	conn, err := p.d.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return sqlConn{conn}, nil
}

func (p sqlPool) stat() (int, int, int) {
	st := p.d.DB().Stats()
	return st.InUse, 0, st.MaxOpenConnections
}

// sqlConn is one connection of a sqlPool, taken for one statement.
type sqlConn struct{ *SQLConn }

func (c sqlConn) Release()                       { c.Close() }
func (c sqlConn) broken() bool                   { return false } // database/sql drops a connection its driver reports bad
func (c sqlConn) ping(ctx context.Context) error { return c.Ping(ctx) }

// Conns hands out the connections a Locker's statements run on.
//
// On a pool shared with the application's jobs, jobs that hold every
// connection past the trust window make every lease lost while the
// database is fine: the heartbeat waits in the pool's queue behind them.
// Every wait for a pool connection is therefore timed on its own, so that a
// failure says "waited 4.9s for a connection from the pool (10 of 10 in
// use)" instead of looking like a database failure, and a lease lost while
// the heartbeat waits says so. The converse holds too: a database that
// refuses connections, or cannot be reached, reads as "could not connect
// to the database (unreachable ...)", never as a pool whose connections
// are all in use.
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
// A DB of SQL is a pool too, and is treated as one: each statement takes
// a connection of its own (a *sql.Conn), and claims hold all but one of
// them (none are kept: NewLocker refuses WithKeptConnection on it). Any
// other DB (a *pgx.Conn, a wrapper) is used as given.
type Conns struct {
	db      DB
	pool    Pooler   // db as a *pgxpool.Pool, or nil
	src     connPool // db as a pool (pool, or a DB of SQL), or nil
	reserve bool     // keep one connection of src

	claim, heartbeat, release DB // the DB each kind of statement runs on
	// claimRead is claim for a read, sent as any other statement (not
	// under answering): a read has no outcome to learn when its caller
	// gives up, and returns as its context ends.
	claimRead DB

	slot chan struct{} // holds the reserve while a statement uses it
	// back is cancelled, and replaced, whenever the slot is given back: a
	// release waiting for a connection outside the gate (AwaitRelease)
	// then tries the reserve again. Guarded by mu.
	back       context.Context
	backCancel context.CancelFunc
	single     chan struct{} // held by the statement in flight on a DB that is not a pool
	// claims bounds the pool connections claims hold at once to all but
	// one: a claim may wait on a row lock for as long as it is held, and
	// claims of many locked rows must never take every connection, or the
	// heartbeat would wait behind them until every lease is lost. Of
	// those, it keeps the last for statements whose wait is bounded
	// (claimBound.mayWait).
	claims claimBound

	mu        sync.Mutex
	held      PoolConn  // the reserve; nil until the first claim, once broken, and after close
	idleSince time.Time // when the reserve was last put back
	closed    bool
	waitSince time.Time // when the heartbeat started waiting for a pool connection; zero when not waiting
	starved   error     // the heartbeat's last wait for a pool connection, if it failed
	// Closing are the connections closed after a cancel request, still
	// cleaning up: Close waits for them.
	Closing Closings

	// unreachable is the last failure to open a new pool connection, nil
	// once a connection was had again: a statement that times out waiting
	// behind others names it, since they too are waiting on the database.
	unreachable error
}

// maxIdleUnchecked is how long the reserve may idle before it is checked
// with a ping before its next use, as pgxpool checks its own connections.
const maxIdleUnchecked = time.Second

type use int

const (
	useClaim     use = iota // a pool connection, kept as the reserve when there is none
	useHeartbeat            // the reserve, taken from the pool when there is none
	useRelease              // the reserve when free, else a pool connection (see ReleaseNow)
)

// NewConns hands out the connections of db; keep keeps one of a
// *pgxpool.Pool as the reserve (WithKeptConnection).
func NewConns(db DB, keep bool) *Conns {
	c := &Conns{db: db, slot: make(chan struct{}, 1), single: make(chan struct{}, 1)}
	c.back, c.backCancel = context.WithCancel(context.Background())
	switch p := db.(type) {
	case Pooler:
		c.pool, c.src = p, pgxPool{p}
	case *SQLDB:
		c.src = sqlPool{p}
	}
	if c.src != nil {
		c.reserve = keep // NewLocker refuses it for a pool of one, which would leave claims nothing
		c.claims = claimBound{size: func() int { _, _, size := c.src.stat(); return size }}
		if p, ok := db.(Pooler); ok {
			// A pgxpool's size is set when it is made, and each Stat
			// allocates: read it once, not at every claim.
			size := int(p.Stat().MaxConns())
			c.claims.size = func() int { return size }
		}
		if s, ok := db.(*SQLDB); ok {
			c.claims.cancelOnce = s.cancelsOnce()
		}
	} else {
		c.claims.single = true
	}
	c.claim, c.heartbeat, c.release = connDB{c: c, u: useClaim}, connDB{c: c, u: useHeartbeat}, connDB{c: c, u: useRelease}
	c.claimRead = connDB{c: c, u: useClaim, read: true}
	return c
}

// claimConns is how many connections of a pool of size claims may hold at
// once: all but one, and at least one.
func claimConns(size int) int { return max(1, size-1) }

// ClaimLimit is how many claim statements a Locker sends at once before it
// makes the next ones wait and go together: most, or fewer on a pool that
// could not serve that many and the heartbeat.
func (c *Conns) ClaimLimit(most int) int {
	if n := c.claims.limit(); n > 0 {
		return min(most, n)
	}
	return most
}

// Claim is the DB a claim's statement runs on.
func (c *Conns) Claim() DB { return c.claim }

// ClaimRead is Claim for a read, never sent under answering: it ends
// with its context.
func (c *Conns) ClaimRead() DB { return c.claimRead }

// Release is the DB a release's statement runs on.
func (c *Conns) Release() DB { return c.release }

// DB is the DB the connections are handed out of.
func (c *Conns) DB() DB { return c.db }

// Pool is the DB as a *pgxpool.Pool, or nil.
func (c *Conns) Pool() Pooler { return c.pool }

// IsPool reports whether the DB is a pool (a *pgxpool.Pool or a SQLDB).
func (c *Conns) IsPool() bool { return c.src != nil }

// MayWait reports whether a claim statement may wait on a row lock for as
// long as it is held (claimBound.mayWait); Waited ends what it let in.
func (c *Conns) MayWait() bool { return c.claims.mayWait() }

// Waited ends what MayWait let in.
func (c *Conns) Waited() { c.claims.waited() }

// Pressed reports whether MayWait would refuse now.
func (c *Conns) Pressed() bool { return c.claims.pressed() }

// claimBound lets claims hold at most claimConns of the pool's size as it
// is when each claim takes its connection: a *sql.DB's limit may be set or
// changed after New. A pool without a limit (size 0) opens a connection for
// the heartbeat whatever claims hold: claims are not bounded then.
type claimBound struct {
	size   func() int // the pool's size now; nil: not a pool
	single bool       // not a pool: one connection, which every statement shares
	// cancelOnce: the driver sends the one cancel request of a statement
	// itself (lib/pq), and pglease cannot send it again (sqlDB.cancelsOnce).
	cancelOnce bool
	mu         sync.Mutex
	held       int
	waiting    int           // claim statements in flight that may wait on a row lock without bound (mayWait)
	freed      chan struct{} // made by a claim that waits, closed (and forgotten) when a claim gives its connection back
}

// mayWait reports whether a claim statement may wait on a row lock for as
// long as it is held, and returns what ends that: only while fewer than
// all but one of the connections claims may hold are taken by such
// statements. The last is left to statements that wait on a row lock for a
// bounded time (a burst's, a claim's sent with a lock wait): claims of
// rows an open transaction holds, however many, then cannot keep a claim
// of a free key waiting for a connection longer than that wait. On a
// single connection (not a pool), never: it is always the last, and the
// heartbeat's. Through a driver whose one cancel request may be lost
// (cancelOnce), never either: a request that reaches the backend before
// the statement does is ignored, and the claim would then wait as long
// as the row lock is held, its caller, and Close, with it. On a pool
// without a size, always.
func (b *claimBound) mayWait() bool {
	if b.single || b.cancelOnce {
		return false
	}
	limit := b.limit()
	b.mu.Lock()
	defer b.mu.Unlock()
	if limit > 0 && b.waiting >= limit-1 {
		return false
	}
	b.waiting++
	return true
}

// pressed reports whether mayWait would refuse now: a statement sent now
// may get only the last connection claims may hold.
func (b *claimBound) pressed() bool {
	if b.single {
		return true
	}
	limit := b.limit()
	b.mu.Lock()
	defer b.mu.Unlock()
	return limit > 0 && b.waiting >= limit-1
}

// waited ends what mayWait let in.
func (b *claimBound) waited() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.waiting--
}

// limit is how many connections claims may hold now, 0 for no bound.
func (b *claimBound) limit() int {
	if b.size == nil {
		return 0
	}
	if size := b.size(); size > 0 {
		return claimConns(size)
	}
	return 0
}

// take waits until a claim may hold one more connection, which give gives
// back; limit is the bound it waited for, for the error.
func (b *claimBound) take(ctx context.Context) (limit int, err error) {
	for {
		limit = b.limit()
		b.mu.Lock()
		if limit == 0 || b.held < limit {
			b.held++
			b.mu.Unlock()
			return limit, nil
		}
		if b.freed == nil {
			b.freed = make(chan struct{})
		}
		freed := b.freed
		b.mu.Unlock()
		select {
		case <-freed:
		case <-ctx.Done():
			return limit, context.Cause(ctx)
		}
	}
}

func (b *claimBound) give() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held--
	if b.freed != nil {
		close(b.freed)
		b.freed = nil
	}
}

// take returns the DB one statement of kind u runs on, and what to call once
// the statement is done. Its errors are NotSentError: the statement was
// not sent. A statement whose context ended while it waited for its
// connection is not sent: a driver that sends it all the same (database/sql
// hands a connection over even then) would send its cancel request at
// once, which could reach the backend before the statement and be ignored.
func (c *Conns) take(ctx context.Context, u use) (DB, func(), error) {
	db, done, err := c.takeConn(ctx, u)
	if err != nil {
		return nil, nil, NotSentError(err)
	}
	if ctx.Err() != nil {
		if c.src != nil {
			// Its pool may have pinged it under ctx as it handed it over
			// (pgx's stdlib does), and pgx sent a cancel request for that.
			c.drop(db)
		}
		done()
		return nil, nil, NotSentError(fmt.Errorf("its context ended while it waited for a connection: %w", context.Cause(ctx)))
	}
	return db, done, nil
}

// takeConn is take, its errors unmarked, whether or not ctx has ended.
func (c *Conns) takeConn(ctx context.Context, u use) (DB, func(), error) {
	if c.src == nil {
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
		if c.Closing.closedGiven.Load() {
			<-c.single
			return nil, nil, errClosedGiven
		}
		return c.db, func() { <-c.single }, nil
	}
	if c.reserve {
		switch u {
		case useHeartbeat:
			select {
			case c.slot <- struct{}{}:
			case <-ctx.Done():
				return nil, nil, fmt.Errorf("waiting for the connection kept for the heartbeat%s: %w", c.unreachableNote(), context.Cause(ctx))
			}
			return c.takeReserve(ctx, u)
		case useRelease:
			if conn, _ := c.reserveNow(ctx); conn != nil {
				return conn, func() { c.putBack(conn) }, nil
			}
		}
	}
	if u == useClaim {
		return c.takeClaim(ctx)
	}
	conn, err := c.acquire(ctx, u == useHeartbeat)
	if err != nil {
		return nil, nil, err
	}
	return conn, conn.Release, nil
}

// takeClaim takes a pool connection for a claim within the claims' bound,
// and gives back both, the bound last, in the one closure it returns.
func (c *Conns) takeClaim(ctx context.Context) (DB, func(), error) {
	limit, err := c.claims.take(ctx)
	if err != nil {
		return nil, nil, fmt.Errorf("waiting for one of the %d pool connections claims may hold at once (one is kept free for the heartbeat)%s: %w", limit, c.unreachableNote(), err)
	}
	conn, err := c.acquire(ctx, false)
	if err != nil {
		c.claims.give()
		return nil, nil, err
	}
	if c.reserve {
		return conn, func() { c.keep(conn); c.claims.give() }, nil
	}
	return conn, func() { conn.Release(); c.claims.give() }, nil
}

// takeReserve returns the reserve, taken from the pool if there is none; the
// caller holds the slot.
func (c *Conns) takeReserve(ctx context.Context, u use) (DB, func(), error) {
	conn := c.checked(ctx)
	if conn == nil {
		var err error
		if conn, err = c.acquire(ctx, u == useHeartbeat); err != nil {
			c.freeSlot()
			return nil, nil, err
		}
		c.hold(conn)
	}
	return conn, func() { c.putBack(conn) }, nil
}

// checked returns the reserve, nil if there is none or if it was closed
// while it idled (idle_session_timeout, a firewall, a pooler, a restart):
// pgxpool would not have handed it out either, and it is dropped, as it is
// when ctx ended while it was pinged. The caller holds the slot.
func (c *Conns) checked(ctx context.Context) PoolConn {
	c.mu.Lock()
	conn, idle := c.held, time.Since(c.idleSince)
	c.mu.Unlock()
	if conn == nil || idle <= maxIdleUnchecked || conn.ping(ctx) == nil && ctx.Err() == nil {
		return conn
	}
	c.mu.Lock()
	if c.held == conn {
		c.held = nil
	}
	c.mu.Unlock()
	c.drop(conn)   // pinged as ctx ended: a cancel request pgx sent for the ping may be on its way
	conn.Release() // the pool destroys a broken connection
	return nil
}

// ReleasesWait reports whether every release waits for a pool connection
// of its own: on a pool, without a reserve.
func (c *Conns) ReleasesWait() bool { return c.src != nil && !c.reserve }

// reserveNow returns the reserve if it is free and there is one, without
// waiting for anything but its check (checked). Otherwise it returns
// nil, and back while the reserve is busy: the context that ends once it is
// given back. Whoever gets it gives it back with putBack.
func (c *Conns) reserveNow(ctx context.Context) (PoolConn, context.Context) {
	if !c.reserve {
		return nil, nil
	}
	c.mu.Lock()
	back := c.back // before the slot is tried: a reserve given back after the try ends it
	c.mu.Unlock()
	select {
	case c.slot <- struct{}{}:
	default:
		return nil, back
	}
	conn := c.checked(ctx)
	if conn == nil {
		c.freeSlot()
		return nil, nil
	}
	return conn, nil
}

// ReleaseNow returns the DB a release statement runs on while no
// heartbeat round can (Locker.releaseOnce), if it can be had without
// waiting for a connection: had (a pool connection had before, or nil),
// else the reserve if it is free. A release that waited there for a pool
// connection would keep the heartbeat's round out meanwhile, and on a pool
// held by jobs lose every lease that WithKeptConnection is there to keep.
// On a DB that is not a pool, that DB: the heartbeat waits for its one
// connection anyway. Otherwise ReleaseNow returns nil, and what
// AwaitRelease waits for besides a pool connection. The statement done,
// Released gives the DB back.
func (c *Conns) ReleaseNow(ctx context.Context, had PoolConn) (db DB, back context.Context) {
	switch {
	case had != nil:
		return &takenDB{db: had, c: c}, nil
	case c.src == nil:
		return c.release, nil
	}
	conn, back := c.reserveNow(ctx)
	if conn == nil {
		return nil, back
	}
	return &takenDB{db: conn, c: c, kept: true}, nil
}

// Released gives back db, which ReleaseNow returned for a statement sent
// under ctx, once the statement is done, as DropIfEnded(ctx, db, done)()
// would: one allocation for the DB, where a done of its own would be a
// second.
func (c *Conns) Released(ctx context.Context, db DB) {
	if ctx.Err() != nil {
		c.drop(db)
	}
	switch t := db.(type) {
	case *takenDB:
		t.back()
	case connDB: // a DB that is not a pool: each statement gave its connection back
	default:
		panic(fmt.Sprintf("driver: Released given a %T, which ReleaseNow never returns", db))
	}
}

// AwaitRelease waits, outside the gate, for a pool connection for a
// release (ReleaseNow), or for the reserve to be given back (back, when not
// nil), whichever comes first: it returns nil then.
func (c *Conns) AwaitRelease(ctx, back context.Context) (PoolConn, error) {
	actx := ctx
	if back != nil {
		var cancel context.CancelFunc
		actx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(back, cancel)()
	}
	conn, err := c.acquire(actx, false)
	if err != nil && ctx.Err() == nil && back != nil && back.Err() != nil {
		return nil, nil
	}
	if err != nil {
		return nil, NotSentError(err)
	}
	return conn, nil
}

// AwaitHeartbeat returns the DB a heartbeat round's statements run on, and
// what to call once the round is done. From a pool without a reserve it
// takes the round's connection at once, before the round waits its turn at
// the gate, as a release takes its own (AwaitRelease): a round waiting there
// holds up the releases behind it, which may hold every connection of the
// pool. Otherwise each statement takes its own.
func (c *Conns) AwaitHeartbeat(ctx context.Context) (DB, func(), error) {
	if !c.ReleasesWait() {
		return c.heartbeat, func() {}, nil
	}
	conn, err := c.acquire(ctx, true)
	if err != nil {
		return nil, nil, NotSentError(err)
	}
	return &takenDB{db: conn, c: c}, conn.Release, nil
}

// freeSlot gives the slot back, and ends back for the releases waiting
// for the reserve.
func (c *Conns) freeSlot() {
	<-c.slot
	c.mu.Lock()
	defer c.mu.Unlock()
	c.backCancel()
	c.back, c.backCancel = context.WithCancel(context.Background())
}

// hold makes conn the reserve; the caller holds the slot.
func (c *Conns) hold(conn PoolConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return // put back and released by putBack
	}
	c.held = conn
}

// putBack ends a statement on the reserve: a broken one is dropped, and
// after close it goes back to the pool.
func (c *Conns) putBack(conn PoolConn) {
	c.mu.Lock()
	if conn.broken() || c.closed {
		if c.held == conn {
			c.held = nil
		}
		conn.Release() // the pool destroys a broken connection
	}
	c.idleSince = time.Now()
	c.mu.Unlock()
	c.freeSlot()
}

// keep ends a claim's statement: its connection becomes the reserve if
// there is none, and goes back to the pool otherwise.
func (c *Conns) keep(conn PoolConn) {
	select {
	case c.slot <- struct{}{}:
	default:
		conn.Release()
		return
	}
	c.mu.Lock()
	if c.held == nil && !c.closed && !conn.broken() {
		c.held, conn, c.idleSince = conn, nil, time.Now()
	}
	c.mu.Unlock()
	c.freeSlot()
	if conn != nil {
		conn.Release()
	}
}

// Close gives the reserve back to the pool, now if it is free, or else as
// soon as the statement using it ends.
func (c *Conns) Close() {
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
	c.freeSlot()
	if conn != nil {
		conn.Release()
	}
}

// acquire takes a connection from the pool, timing the wait so that a
// failure names it. A wait of the heartbeat is recorded for cause.
func (c *Conns) acquire(ctx context.Context, heartbeat bool) (PoolConn, error) {
	start := time.Now()
	if heartbeat {
		c.mu.Lock()
		c.waitSince = start
		c.mu.Unlock()
	}
	conn, err := c.src.get(ctx)
	c.mu.Lock()
	if err != nil {
		err = c.acquireError(time.Since(start), err)
	} else {
		c.unreachable = nil
	}
	if heartbeat {
		c.waitSince, c.starved = time.Time{}, err
	}
	c.mu.Unlock()
	return conn, err
}

// acquireError words err, the failure of a wait of waited for a pool
// connection; the caller holds c.mu. A failed attempt to connect (refused,
// no route, DNS) is the database being unreachable, and one the server
// answered (authentication, too many connections) is the server refusing:
// more connections would help neither, and neither must read as a pool
// whose connections are all in use. A wait that ended while the pool had
// connections to spare was a wait for a new connection to be opened.
func (c *Conns) acquireError(waited time.Duration, err error) error {
	waited = waited.Round(time.Millisecond)
	var connect *pgconn.ConnectError
	if errors.As(err, &connect) {
		after := ""
		if waited > 0 {
			after = fmt.Sprintf(" after %v", waited)
		}
		var refused *pgconn.PgError
		if errors.As(err, &refused) {
			// The server answered: authentication, a missing database, too
			// many connections. Reachable, but refusing.
			err = fmt.Errorf("could not connect to the database (the server refused the pool's new connection%s): %w", after, err)
		} else {
			err = fmt.Errorf("could not connect to the database (unreachable: the pool's attempt to open a connection failed%s): %w", after, err)
		}
		c.unreachable = err
		return err
	}
	if c.spare() {
		return fmt.Errorf("waited %v for a new connection to the database, which did not open (the pool has %s)%s: %w", waited, c.inUse(), c.unreachableNoteLocked(), err)
	}
	return fmt.Errorf("waited %v for a connection from the pool (%s)%s: %w", waited, c.inUse(), c.unreachableNoteLocked(), err)
}

// spare reports whether the pool has room for a connection that no one is
// opening: a wait for a connection then was a wait for one to open, not
// for one of the pool's to be handed back. (A connection being opened for
// another waiter, after a broken one was dropped, takes its room.)
func (c *Conns) spare() bool {
	inUse, opening, size := c.src.stat()
	return size == 0 || inUse+opening < size
}

// unreachableNote names the last failure to connect, if no connection has
// been had since: empty otherwise.
func (c *Conns) unreachableNote() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.unreachableNoteLocked()
}

func (c *Conns) unreachableNoteLocked() string {
	if c.unreachable == nil {
		return ""
	}
	return "; the last attempt to connect failed: " + c.unreachable.Error()
}

func (c *Conns) inUse() string {
	inUse, _, size := c.src.stat()
	if size == 0 {
		return fmt.Sprintf("%d in use, no limit", inUse)
	}
	return fmt.Sprintf("%d of %d in use", inUse, size)
}

// Cause says why the heartbeat has had no connection, if it is waiting for
// one from the pool or its last wait failed; empty otherwise.
func (c *Conns) Cause() string {
	c.mu.Lock()
	since, starved := c.waitSince, c.starved
	c.mu.Unlock()
	switch {
	case !since.IsZero():
		if c.spare() {
			return fmt.Sprintf("the heartbeat has waited %v for a new connection to the database to open (the pool has %s)%s", time.Since(since).Round(time.Millisecond), c.inUse(), c.unreachableNote())
		}
		return fmt.Sprintf("the heartbeat has waited %v for a connection from the pool (%s)", time.Since(since).Round(time.Millisecond), c.inUse())
	case starved != nil:
		return "the heartbeat " + starved.Error()
	}
	return ""
}

// connDB is the DB of one kind of statement: each call takes a connection
// for that statement and gives it back once done (for Query, once the rows
// are closed; for QueryRow, once scanned). A claim's statement on a pool
// connection is sent under Answering: its outcome stays known when its caller
// gives up. Begin, which no statement of the protocol uses, goes to the DB
// as given.
type connDB struct {
	c    *Conns
	u    use
	read bool // a read (Conns.ClaimRead): never under answering
}

func (d connDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	defer d.c.DropIfEnded(ctx, db, done)()
	tag, err := db.Exec(ctx, sql, args...)
	return tag, Confirmed(ctx, explainPooler(err))
}

func (d connDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return nil, err
	}
	if a := d.answering(ctx, db); a != nil {
		rows, err := db.Query(a.Ctx(), sql, args...)
		if err != nil {
			err = a.End(err)
			done()
			return nil, explainPooler(err)
		}
		return &doneRows{Rows: a.Rows(rows), ctx: ctx, done: done}, nil
	}
	done = d.c.DropIfEnded(ctx, db, done)
	rows, err := db.Query(ctx, sql, args...)
	if err != nil {
		done()
		return nil, explainPooler(err)
	}
	return &doneRows{Rows: rows, ctx: ctx, done: done}, nil
}

func (d connDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	db, done, err := d.c.take(ctx, d.u)
	if err != nil {
		return ErrRow{err}
	}
	if a := d.answering(ctx, db); a != nil {
		a.row = doneRow{row: db.QueryRow(a.Ctx(), sql, args...), a: a, ctx: ctx, done: done, pgxRow: pgxRowOf(db)}
		return &a.row
	}
	return doneRow{row: db.QueryRow(ctx, sql, args...), ctx: ctx, done: d.c.DropIfEnded(ctx, db, done), pgxRow: pgxRowOf(db)}
}

// pgxRowOf reports whether db's QueryRow returns pgx's own row, which hands
// a lone pgx.RowScanner its rows (scanClaimed), rather than a DB the
// application wraps.
func pgxRowOf(db DB) bool {
	switch db.(type) {
	case pgxConn, *pgx.Conn, *pgxpool.Conn:
		return true
	}
	return false
}

// poolerHint is the fix explainPooler adds to the errors of pgx's
// statement cache behind a transaction pooler.
const poolerHint = "behind a transaction pooler such as PgBouncer, pgx's default statement cache sends prepared statements " +
	"that another client's connection may own or lack: add default_query_exec_mode=exec (or simple_protocol) to the connection string, " +
	"or set config.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec"

// explainPooler adds poolerHint to err when the server refused a prepared
// statement the way it does behind PgBouncer in transaction pooling mode
// with pgx's default exec mode (cache_statement), or with describe_exec:
// PgBouncer hands each transaction to any server connection, so a
// statement prepared on one is "already exists" (42P05) or "does not
// exist" (26000) on another, and an unnamed one bound on another
// connection is a protocol violation (08P01). The server's error stays
// wrapped, and so does every other error, untouched.
func explainPooler(err error) error {
	if !PreparedStatementMismatch(err) {
		return err
	}
	return fmt.Errorf("%w (%s)", err, poolerHint)
}

func (d connDB) Begin(ctx context.Context) (pgx.Tx, error) { return d.c.db.Begin(ctx) }

// answering is how a claim's statement on db is sent so that its outcome
// stays known when its caller gives up (see Answering), or nil for any
// other statement, and for a DB whose connection pglease cannot reach.
func (d connDB) answering(ctx context.Context, db DB) *Answering {
	if d.u != useClaim || d.read {
		return nil
	}
	switch conn := db.(type) {
	case pgxConn:
		return Answer(ctx, conn.Conn.Conn().PgConn(), true, &d.c.Closing)
	case sqlConn:
		// pgx's stdlib: its pgx connection, destroyed by database/sql
		// once closed; lib/pq: none, its driver cancels (Answer).
		return Answer(ctx, conn.PgConn(), true, &d.c.Closing)
	case *pgx.Conn:
		return Answer(ctx, conn.PgConn(), false, &d.c.Closing)
	case *pgxpool.Conn:
		return Answer(ctx, conn.Conn().PgConn(), false, &d.c.Closing)
	}
	return nil
}

// doneRows gives the connection back when the rows are closed. Rows read
// to their end after ctx, their statement's, ended are not confirmed
// (Confirmed).
type doneRows struct {
	pgx.Rows
	ctx   context.Context
	done  func()
	taken *takenDB // the rows' connection, if a takenDB: it checks ctx (takenDB.ended)
	once  sync.Once
}

func (r *doneRows) Close() {
	r.Rows.Close()
	r.once.Do(func() {
		if r.taken != nil {
			r.taken.ended(r.ctx)
		}
		r.done()
	})
}

func (r *doneRows) Err() error { return Confirmed(r.ctx, explainPooler(r.Rows.Err())) }

// doneRow gives the connection back once scanned, and ends the statement
// first (Answering.End) if it was sent under answering; that one is kept
// in its Answering (Answering.row), which the statement allocated anyway.
// A row scanned after ctx, its statement's, ended is not confirmed
// (Confirmed).
type doneRow struct {
	row   pgx.Row
	a     *Answering // nil: not sent under answering
	ctx   context.Context
	done  func()
	taken *takenDB // the row's connection, if a takenDB: it checks ctx (takenDB.ended)
	// pgxRow: row is pgx's own (pgxRowOf).
	pgxRow bool
}

// scanClaim is scanClaimed's. A row of pgx's own sent under answering (a
// claim's) scans into its Answering's claim, through its destination
// (Answering.claim), which the statement allocated anyway; any other is
// scanned column by column.
func (r doneRow) scanClaim() (Claimed, error) {
	if r.a != nil && r.pgxRow {
		r.a.claim.dest[0] = &r.a.claim.row
		err := r.Scan(r.a.claim.dest[:]...)
		return Claimed(r.a.claim.row), err
	}
	var c Claimed
	err := r.Scan(claimColumns(&c)...)
	return c, err
}

func (r doneRow) Scan(dest ...any) error {
	defer r.done()
	err := r.row.Scan(dest...)
	if r.taken != nil {
		r.taken.ended(r.ctx)
	}
	if r.a != nil {
		err = r.a.End(err)
	}
	return Confirmed(r.ctx, explainPooler(err))
}

// takenDB is a connection taken for a release (ReleaseNow) or a heartbeat
// round (AwaitHeartbeat), its errors explained and its successes confirmed
// as connDB's are. Its statements may each run under a context of their
// own (a round's loss read has its own timeout): a statement whose context
// ended in flight closes the connection at once (Conns.drop), as connDB
// does, since a cancel request pgx sent for it could land on whatever runs
// there next, the next user's claim among them, whatever the context that
// took the connection says.
type takenDB struct {
	db   PoolConn
	c    *Conns // drops the connection; nil only in tests
	kept bool   // the reserve: back to its slot (putBack), not to the pool
	// rows are those of its latest Query, kept here rather than allocated
	// apart: a connection runs one statement at a time (pgx refuses a
	// Query while the rows of the previous one are open), and the
	// statements of a release or a heartbeat round each close their rows
	// before the next is sent, on the one goroutine that holds the DB.
	rows doneRows
}

// back gives the connection back.
func (d *takenDB) back() {
	if d.kept {
		d.c.putBack(d.db)
		return
	}
	d.db.Release()
}

// ended closes the connection if ctx, a statement's, has ended: its cancel
// request may still be on its way.
func (d *takenDB) ended(ctx context.Context) {
	if ctx.Err() != nil && d.c != nil {
		d.c.drop(d.db)
	}
}

func (d *takenDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	tag, err := d.db.Exec(ctx, sql, args...)
	d.ended(ctx)
	return tag, Confirmed(ctx, explainPooler(err))
}

func (d *takenDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	rows, err := d.db.Query(ctx, sql, args...)
	if err != nil {
		d.ended(ctx)
		return nil, explainPooler(err)
	}
	d.rows = doneRows{Rows: rows, ctx: ctx, done: func() {}, taken: d}
	return &d.rows, nil
}

func (d *takenDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	return doneRow{row: d.db.QueryRow(ctx, sql, args...), ctx: ctx, done: func() {}, taken: d}
}

func (d *takenDB) Begin(ctx context.Context) (pgx.Tx, error) { return d.db.Begin(ctx) }
