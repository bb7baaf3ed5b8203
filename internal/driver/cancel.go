package driver

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// AnswerGrace is how long a claim statement whose caller gave up waits
	// for the server's answer to the cancel requests sent for it, before
	// its connection is closed and its outcome is unknown.
	AnswerGrace = time.Second
	// cancelResend is how often the cancel request is sent again while the
	// statement has not answered: the server ignores a cancel request that
	// reaches a connection between two messages of one statement (pgx
	// prepares a statement in one round trip and runs it in the next).
	cancelResend = 50 * time.Millisecond
)

// Answering runs a claim's statement so that its outcome is known even
// when the caller gives up while it runs. pgx's default, closing the socket
// as the context ends, leaves the statement running on the server: a claim
// waiting on a row lock then commits after its caller returned, and the
// Locker, reading the row too early to see it, could not give it back.
// Instead the statement runs on a context of its own; when the caller's
// ends, the server is asked to cancel it (a cancel request, sent again
// every cancelResend), and the statement's own reply says what it did:
// cancelled (57014, nothing written) or done (its rows). Only a server that
// does not answer within AnswerGrace leaves the outcome unknown; pgx then
// closes the connection.
//
// Without a pgx connection to send it on (lib/pq's, through database/sql:
// pg is nil), the statement runs on the caller's context, and the driver
// sends the cancel request itself as that context ends.
//
// A pool connection that got a cancel request is closed once its statement
// returns (discard), so that a late cancel can never reach a statement of
// its next user. A connection the Locker was given is kept when every
// cancel request sent for the statement was answered (the server closes a
// cancel request's connection only once it has signalled the backend, and
// a signal that reaches an idle backend is ignored), and closed otherwise
// (unanswered): a request still on its way could land on a later
// statement, and cut the wait of its commit for a synchronous standby,
// which then reports success.
type Answering struct {
	caller  context.Context
	pg      *pgconn.PgConn
	discard bool
	closing *Closings
	// ctx is the statement's: the caller's values, never ended, so that
	// pgx watches nothing. When the server does not answer within
	// AnswerGrace, requestCancel sets the connection's deadline instead,
	// as pgx's own handler of an ended context does, and pgx closes it.
	ctx  context.Context
	stop func() bool
	// mu guards the two channels, made only once a cancel request is due,
	// by the first of requestCancel and End to need them.
	mu       sync.Mutex
	returned chan struct{} // closed once the statement has returned
	sent     chan struct{} // closed once the cancel requests are over
	gaveUp   atomic.Bool   // the server did not answer within AnswerGrace
	// unanswered: a cancel request's connection was not closed by the
	// server (an error, or AnswerGrace ran out): it may still land.
	unanswered atomic.Bool
	once       sync.Once
	// row is the statement's row when it has one (connDB.QueryRow): kept
	// here, as the Answering is made for this one statement, rather than
	// allocated apart.
	row doneRow
	// claim is where a claim statement's row is scanned (doneRow.scanClaim),
	// and the one destination of that Scan.
	claim struct {
		row  claimRow
		dest [1]any
	}
}

// noStop is the stop of a statement with no cancel request to send.
func noStop() bool { return true }

// Answer is how a statement that caller may give up on is sent on pg
// (nil: a driver that cancels itself), pg closed after a cancel if
// discard, its clean-up added to closing: send it on a.Ctx(), and end
// what it returned with a.Rows or a.End (a row: doneRow ends it).
func Answer(caller context.Context, pg *pgconn.PgConn, discard bool, closing *Closings) *Answering {
	a := &Answering{caller: caller, pg: pg, discard: discard, closing: closing, ctx: caller, stop: noStop}
	if pg == nil || caller.Done() == nil {
		return a
	}
	a.ctx = context.WithoutCancel(caller)
	a.stop = context.AfterFunc(caller, a.requestCancel)
	return a
}

// signals are the channels between requestCancel and End.
func (a *Answering) signals() (returned, sent chan struct{}) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.returned == nil {
		a.returned, a.sent = make(chan struct{}), make(chan struct{})
	}
	return a.returned, a.sent
}

// requestCancel sends cancel requests until the statement returns, for at
// most AnswerGrace, after which the statement's context ends. Each request
// waits for the server to take it, a round trip: they go out each on its
// own, every cancelResend, so that on a slow link one still lands within
// cancelResend of the statement reaching the backend, not a round trip
// later. It returns once every request sent has been taken.
func (a *Answering) requestCancel() {
	returned, sent := a.signals()
	defer close(sent)
	var sending sync.WaitGroup
	defer sending.Wait()
	deadline := time.Now().Add(AnswerGrace)
	for {
		sending.Go(func() {
			rctx, cancel := context.WithDeadline(a.ctx, deadline)
			defer cancel()
			// pgx reads the server's answer (it closes the request's
			// connection once it signalled the backend) but returns
			// nil when rctx cut that read: a request is answered only
			// if it returned nil before rctx ended.
			if a.pg.CancelRequest(rctx) != nil || rctx.Err() != nil {
				a.unanswered.Store(true)
			}
		})
		next := time.NewTimer(min(cancelResend, max(0, time.Until(deadline))))
		select {
		case <-returned:
			next.Stop()
			return
		case <-next.C:
		}
		if !time.Now().Before(deadline) {
			a.gaveUp.Store(true)
			// The statement's read fails and pgx closes the
			// connection: the outcome is unknown.
			_ = a.pg.Conn().SetDeadline(time.Now())
			return
		}
	}
}

// Ctx is the context the statement is sent on.
func (a *Answering) Ctx() context.Context { return a.ctx }

// Rows are the statement's rows: closing them ends the statement (End).
func (a *Answering) Rows(rows pgx.Rows) pgx.Rows { return answeredRows{rows, a} }

// End is called once the statement has returned (its row scanned, its rows
// closed); it returns err as the caller sees it.
func (a *Answering) End(err error) error {
	a.once.Do(func() {
		if !a.stop() { // cancel requests were sent
			returned, sent := a.signals()
			close(returned)
			<-sent
			if a.gaveUp.Load() && !a.pg.IsClosed() {
				// The statement returned before the deadline cut it:
				// its connection is whole, but for the deadline.
				_ = a.pg.Conn().SetDeadline(time.Time{})
			}
			if (a.discard || a.unanswered.Load()) && !a.pg.IsClosed() {
				cctx, cancel := context.WithTimeout(context.Background(), AnswerGrace)
				_ = a.pg.Close(cctx) // the pool destroys it on release
				cancel()
			}
			if !a.discard && a.pg.IsClosed() {
				// Closed here, or by pgx as the deadline cut the statement.
				a.closing.closedGiven.Store(true)
			}
		}
		if a.pg != nil && a.pg.IsClosed() {
			a.closing.add(a.pg.CleanupDone())
		}
	})
	return a.explain(err)
}

// explain names the caller's context in the error of a statement the
// caller gave up on, and says what the server did with it.
func (a *Answering) explain(err error) error {
	cause := context.Cause(a.caller)
	if err == nil || cause == nil || errors.Is(err, cause) {
		return err
	}
	switch {
	case Is(err, QueryCanceled):
		return fmt.Errorf("%w (the claim was cancelled on the server: %w)", cause, err)
	case a.gaveUp.Load():
		return fmt.Errorf("%w (the claim did not end within %v of the cancel request sent for it: %w)", cause, AnswerGrace, err)
	}
	return fmt.Errorf("%w: %w", cause, err)
}

// answeredRows are a claim's rows, sent under Answering.
type answeredRows struct {
	pgx.Rows
	a *Answering
}

func (r answeredRows) Close() {
	r.Rows.Close()
	_ = r.a.End(nil)
}

func (r answeredRows) Err() error { return r.a.explain(r.Rows.Err()) }

// Closings are the connections closed after a cancel whose clean-up (pgx
// sends one more cancel request as it closes a connection in the middle
// of a statement, for up to 15 s) may still run: Close waits for them.
type Closings struct {
	mu   sync.Mutex
	done []<-chan struct{}
	// closedGiven: the connection the Locker was given was closed after a
	// claim's cancel request went unanswered, or after the claim did not
	// end within AnswerGrace of it (Answering), or after a statement's
	// context ended in flight (Conns.DropIfEnded); nothing more is sent.
	closedGiven atomic.Bool
}

// errClosedGiven is the error of every statement of a Locker whose given
// connection it closed (Closings.closedGiven).
var errClosedGiven = errors.New("the connection the Locker was given is closed: a statement of the Locker whose context ended, or a claim " +
	"given up that did not end within a second of its cancel request, may have left a cancel request on its way (one that lands could cut a later " +
	"commit's wait for a synchronous standby, which then reports success): give the Locker a pool, which replaces such a connection, or make a new Locker on a new connection")

func (c *Closings) add(done <-chan struct{}) {
	c.mu.Lock()
	defer c.mu.Unlock()
	kept := c.done[:0]
	for _, d := range c.done {
		select {
		case <-d:
		default:
			kept = append(kept, d)
		}
	}
	kept = append(kept, done)
	c.done = kept
}

// Wait waits for every clean-up, until ctx ends; a later Wait waits again
// for those still running.
func (c *Closings) Wait(ctx context.Context) error {
	c.mu.Lock()
	done := slices.Clone(c.done) // add filters the list in place
	c.mu.Unlock()
	for _, d := range done {
		select {
		case <-d:
		case <-ctx.Done():
			return fmt.Errorf("waiting for a connection closed after a cancel request to finish closing: %w", context.Cause(ctx))
		}
	}
	return nil
}

// DropIfEnded returns done, preceded, when ctx (the context of a statement
// sent on db without answering) ended before the statement returned, by
// closing db's connection: its driver may have sent a cancel request as
// ctx ended (pgx with CancelRequestContextWatcherHandler, lib/pq) that has
// not landed yet and would land on the connection's next statement,
// cutting its commit's wait for a synchronous standby. A pool replaces the
// connection; a connection the Locker was given is not used again
// (errClosedGiven). With pgx's default the driver has closed it already.
func (c *Conns) DropIfEnded(ctx context.Context, db DB, done func()) func() {
	return func() {
		if ctx.Err() != nil {
			c.drop(db)
		}
		done()
	}
}

// drop closes the connection under db, if pglease can reach it.
func (c *Conns) drop(db DB) {
	pg, given := closeUnder(db)
	if pg == nil {
		return
	}
	c.Closing.add(pg.CleanupDone())
	if given {
		c.Closing.closedGiven.Store(true)
	}
}

// closeUnder closes the pgx connection under db, if pglease can reach it
// and it is open, and returns it (closed by pgx already, or now), and
// whether it is a connection given as the DB (a *pgx.Conn) rather than one
// of a pool.
func closeUnder(db DB) (closed *pgconn.PgConn, given bool) {
	var pg *pgconn.PgConn
	switch x := db.(type) {
	case *takenDB:
		return closeUnder(x.db)
	case pgxConn:
		pg = x.Conn.Conn().PgConn()
	case sqlConn:
		pg = x.PgConn() // nil for lib/pq, which closes it itself after a cancel
	case *pgx.Conn:
		pg, given = x.PgConn(), true
	case *pgxpool.Conn:
		pg, given = x.Conn().PgConn(), true
	case pgx.Tx:
		if c := connOf(x); c != nil {
			pg, given = c.PgConn(), true
		}
	}
	if pg == nil {
		return nil, false
	}
	if !pg.IsClosed() { // pgx closes one whose context ended in a read
		cctx, cancel := context.WithTimeout(context.Background(), AnswerGrace)
		_ = pg.Close(cctx) // the pool destroys it on release
		cancel()
	}
	return pg, given
}

// OnOneConnection runs f on one connection of db (taken from it, when db
// is a pool; db itself otherwise, a connection or a transaction on one)
// and, when ctx ended before f returned, closes that connection rather
// than give it back or use it again: a cancel request its
// driver sent as ctx ended (pgx's CancelRequestContextWatcherHandler)
// could otherwise land on its next statement, a Locker's claim among
// them, and cut that commit's wait for a synchronous standby. Admin's and
// Migrate's statements run so.
func OnOneConnection(ctx context.Context, db DB, f func(DB) error) error {
	var src connPool
	switch p := db.(type) {
	case Pooler:
		src = pgxPool{p}
	case *SQLDB:
		src = sqlPool{p}
	default:
		err := f(db)
		if ctx.Err() != nil {
			closeUnder(db)
		}
		return err
	}
	conn, err := src.get(ctx)
	if err != nil {
		return err
	}
	defer conn.Release()
	err = f(conn)
	if ctx.Err() != nil {
		closeUnder(conn)
	}
	return err
}
