package driver

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Outcome is what a statement's failure says it may have written.
type Outcome int

// The outcomes of a statement.
const (
	Done    Outcome = iota // the server's answer came back (a row, no row, or its error)
	NotSent                // it never reached the server
	Unknown                // it may have committed: the reply was lost, or ctx ended in flight
)

// OutcomeOf classifies err, the failure of a statement. An error the
// server raised rolled the statement back; one pgx reports as safe to
// retry, or one raised before a connection was had (NotSentError), never
// left the client. Any other may come after the server committed.
func OutcomeOf(err error) Outcome {
	if err == nil {
		return Done // before the targets of As, which escape, are allocated
	}
	var ns notSentError
	if _, ok := serverError(err); ok || errors.Is(err, pgx.ErrNoRows) {
		return Done
	}
	switch {
	case errors.As(err, &ns), pgconn.SafeToRetry(err):
		return NotSent
	}
	return Unknown
}

// NotSentError is err, the failure of a statement that never left the
// client: no connection could be had for it.
func NotSentError(err error) error { return notSentError{err} }

// notSentError is the failure of a statement that never left the client.
type notSentError struct{ err error }

func (e notSentError) Error() string { return e.err.Error() }
func (e notSentError) Unwrap() error { return e.err }

// A commit that waits for a synchronous standby (synchronous_commit on,
// remote_write or remote_apply, with synchronous_standby_names set) cannot
// be undone once its wait began: a cancel request that reaches it then
// ends the wait with only a WARNING ("canceling wait for synchronous
// replication due to user request ... committed locally, but might not
// have been replicated to the standby") and the statement reports
// success. A failover to that standby loses what it wrote. statement_timeout
// never cuts the wait (PostgreSQL disables it before the commit), and a
// terminated backend drops the connection, an error: only a cancel request
// does, and pglease, pgx configured with pgconn.CancelRequestContextWatcherHandler
// and lib/pq send one when a statement's context ends.
//
// So a Locker counts the success of a statement as confirmed only if its
// context had not ended when the reply was read (Confirmed): otherwise its
// outcome is unknown, whatever the driver, and is treated as a lost reply
// (a claim gives back what it may have taken, a heartbeat round extends
// nothing). A context that ends after the reply was read leaves it
// confirmed; one that ends as the reply arrives may make a confirmed
// statement read as unknown, which costs a give-back, never safety. The
// operator's changes (Admin.Revoke, ForceExpire, Purge) and Migrate's
// commit are judged the same way: an error, never a change reported done
// that a failover may undo.

// unconfirmedError is the success of a statement whose context had ended
// before its reply was read: the server may have ended its commit's wait
// for a synchronous standby early.
type unconfirmedError struct{ cause error }

// Unwrap is the cause of the context's end, so that errors.Is finds it.
func (e unconfirmedError) Unwrap() error { return e.cause }

func (e unconfirmedError) Error() string {
	return fmt.Sprintf("the statement reported success after its context ended (%v): its commit may have been cut short while it waited for a synchronous standby, so its outcome is unknown", e.cause)
}

// Confirmed is err, the outcome of a statement sent on ctx and read to its
// end, or an error of Unknown outcome when the statement succeeded after
// ctx ended.
func Confirmed(ctx context.Context, err error) error {
	if err != nil || ctx.Err() == nil {
		return err
	}
	return unconfirmedError{context.Cause(ctx)}
}

// Answered reports whether err is the success of a statement whose reply
// was read after its context ended (Confirmed's error): its outcome is
// unknown only to a failover, for whatever it wrote is visible to any
// later statement, so a read after it tells all it left.
func Answered(err error) bool {
	var u unconfirmedError
	return errors.As(err, &u)
}
