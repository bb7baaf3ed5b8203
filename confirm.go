package pglease

import (
	"context"
	"fmt"
)

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
// context had not ended when the reply was read (confirmed): otherwise its
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

// confirmed is err, the outcome of a statement sent on ctx and read to its
// end, or unconfirmedError when the statement succeeded after ctx ended.
func confirmed(ctx context.Context, err error) error {
	if err != nil || ctx.Err() == nil {
		return err
	}
	return unconfirmedError{context.Cause(ctx)}
}
