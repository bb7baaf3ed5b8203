package pglease

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// answerGrace is how long a claim statement whose caller gave up waits for
// the server's answer to the cancel request sent for it, before its
// connection is closed and its outcome is unknown.
const answerGrace = time.Second

// answering runs a claim's statement on conn so that its outcome is known
// even when the caller gives up while it runs. pgx's default, closing the
// socket as the context ends, leaves the statement running on the server:
// a claim waiting on a row lock then commits after its caller returned,
// and the Locker, reading the row too early to see it, could not give it
// back. Instead the statement runs on a context of its own; when the
// caller's ends, the server is asked to cancel it (a cancel request), and
// the statement's own reply says what it did: cancelled (57014, nothing
// written) or done (its rows). Only a server that does not answer within
// answerGrace leaves the outcome unknown, as before. A connection that got
// a cancel request is closed once its statement returns, so that a late
// cancel can never reach another statement.
//
// A connection without a canceler (lib/pq's, through database/sql) runs the
// statement on the caller's context: its driver sends the cancel request
// itself as that context ends, and closes the connection after.
type answering struct {
	caller context.Context
	conn   canceler        // nil: the driver cancels
	ctx    context.Context // the statement's
	cancel context.CancelFunc
	stop   func() bool
	sent   chan struct{} // closed once the cancel request has been sent, if it was
	mu     sync.Mutex
	grace  *time.Timer // ends ctx answerGrace after the cancel request
	once   sync.Once
}

// canceler is a connection that can ask the server to cancel the statement
// in flight on it.
type canceler interface {
	cancelRequest(ctx context.Context) error
	// discard closes the connection once its statement has returned, so
	// that its pool destroys it rather than reuse it.
	discard()
}

func answer(caller context.Context, conn canceler) *answering {
	a := &answering{caller: caller, conn: conn, sent: make(chan struct{})}
	if conn == nil {
		a.ctx, a.cancel = caller, func() {}
		a.stop = func() bool { return true }
		return a
	}
	a.ctx, a.cancel = context.WithCancel(context.WithoutCancel(caller))
	a.stop = context.AfterFunc(caller, func() {
		defer close(a.sent)
		// The statement's context ends answerGrace after the request, so
		// that a server that does not answer cannot hold the caller.
		a.mu.Lock()
		a.grace = time.AfterFunc(answerGrace, a.cancel)
		a.mu.Unlock()
		rctx, cancel := context.WithTimeout(a.ctx, answerGrace)
		defer cancel()
		_ = conn.cancelRequest(rctx)
	})
	return a
}

// end is called once the statement has returned (its row scanned, its rows
// closed); it returns err as the caller sees it.
func (a *answering) end(err error) error {
	a.once.Do(func() {
		if !a.stop() { // a cancel request was sent
			<-a.sent
			a.conn.discard()
			a.mu.Lock()
			a.grace.Stop()
			a.mu.Unlock()
		}
		a.cancel()
	})
	return a.explain(err)
}

// explain names the caller's context in the error of a statement the caller
// gave up on, keeping the statement's own error: a 57014 still says the
// server rolled the claim back.
func (a *answering) explain(err error) error {
	if err == nil || a.caller.Err() == nil || errors.Is(err, a.caller.Err()) {
		return err
	}
	return fmt.Errorf("%w (the claim was cancelled on the server: %w)", context.Cause(a.caller), err)
}

// answeredRow is a claim's row, sent under answering.
type answeredRow struct {
	row pgx.Row
	a   *answering
}

func (r answeredRow) Scan(dest ...any) error { return r.a.end(r.row.Scan(dest...)) }

// answeredRows are a claim's rows, sent under answering.
type answeredRows struct {
	pgx.Rows
	a *answering
}

func (r answeredRows) Close() {
	r.Rows.Close()
	_ = r.a.end(nil) // Err reports the rows' error
}

func (r answeredRows) Err() error { return r.a.explain(r.Rows.Err()) }
