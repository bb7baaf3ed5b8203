package driver

import (
	"context"
	"errors"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
)

// The SQLSTATEs pglease acts on.
const (
	StringTooLong                = "22001" // string_data_right_truncation
	DivisionByZero               = "22012" // the guard statement's way to say it matched no row
	InFailedTransaction          = "25P02" // in_failed_sql_transaction
	InvalidStatementName         = "26000" // invalid_sql_statement_name
	ProtocolViolation            = "08P01" // protocol_violation
	SerializationFailure         = "40001" // serialization_failure
	InsufficientPrivilege        = "42501" // insufficient_privilege
	UndefinedTable               = "42P01" // undefined_table
	DuplicatePreparedStatement   = "42P05" // duplicate_prepared_statement
	LockNotAvailable             = "55P03" // lock_not_available: a lock wait passed lock_timeout
	QueryCanceled                = "57014" // query_canceled: a cancel request or statement_timeout
	operatorInterventionRestarts = "57P0"  // class 57P: admin_shutdown, crash_shutdown, cannot_connect_now
)

// Code is the SQLSTATE of the server's error in err's chain, or "" when
// err holds none.
func Code(err error) string {
	if pgErr, ok := serverError(err); ok {
		return pgErr.Code
	}
	return ""
}

// serverError is the server's error in err's chain, if it holds one, as
// errors.As finds it. It walks the chain itself: errors.As needs the
// address of its target, which then escapes, an allocation for every
// statement asked about, a losing claim's pgx.ErrNoRows among them.
func serverError(err error) (*pgconn.PgError, bool) {
	for err != nil {
		if pgErr, ok := err.(*pgconn.PgError); ok { //nolint:errorlint // this loop is the walk of the chain errors.As does
			return pgErr, true
		}
		if x, ok := err.(interface{ As(any) bool }); ok {
			var pgErr *pgconn.PgError
			if x.As(&pgErr) {
				return pgErr, true
			}
		}
		switch x := err.(type) { //nolint:errorlint // unwrapping, one link at a time
		case interface{ Unwrap() error }:
			err = x.Unwrap()
		case interface{ Unwrap() []error }:
			for _, inner := range x.Unwrap() {
				if pgErr, ok := serverError(inner); ok {
					return pgErr, true
				}
			}
			return nil, false
		default:
			return nil, false
		}
	}
	return nil, false
}

// Is reports whether err holds a server error of SQLSTATE code.
func Is(err error, code string) bool {
	return err != nil && Code(err) == code
}

// StatementTimedOut reports whether err is the server's query_canceled
// while ctx has not ended: a statement_timeout, not pglease's own cancel.
func StatementTimedOut(ctx context.Context, err error) bool {
	return Is(err, QueryCanceled) && ctx.Err() == nil
}

// RowError reports whether err, the failure of a burst's statement sent
// under ctx, may come from one of its rows rather than from the statement
// as a whole: a constraint (class 23) or a value the column refuses (class
// 22), a row locked past the burst's lock wait (55P03), a deadlock or
// serialization failure (class 40), or a statement_timeout shorter than
// that lock wait (57014 while ctx is still alive: not a cancellation of
// the caller's). Sent alone, the other rows may well succeed.
func RowError(ctx context.Context, err error) bool {
	code := Code(err)
	if len(code) != 5 {
		return false
	}
	switch code[:2] {
	case "22", "23", "40":
		return true
	}
	return code == LockNotAvailable || StatementTimedOut(ctx, err)
}

// PreparedStatementMismatch reports whether err is what a pooler in
// transaction mode causes with prepared statements: one prepared on a
// server connection is "already exists" (42P05) or "does not exist"
// (26000) on another, and an unnamed one bound on another connection is a
// protocol violation (08P01).
func PreparedStatementMismatch(err error) bool {
	pgErr, ok := serverError(err)
	if !ok {
		return false
	}
	switch pgErr.Code {
	case DuplicatePreparedStatement:
		return true
	case InvalidStatementName, ProtocolViolation:
		return strings.Contains(pgErr.Message, "prepared statement")
	}
	return false
}

// ServerRestarting reports whether err is what a statement meets while the
// server restarts: the server's word that it is shutting down or starting
// up (SQLSTATE class 57P: admin_shutdown, crash_shutdown,
// cannot_connect_now), or a new connection that could not be opened
// (pgconn.ConnectError).
func ServerRestarting(err error) bool {
	if err == nil {
		return false
	}
	if pgErr, ok := serverError(err); ok {
		return strings.HasPrefix(pgErr.Code, operatorInterventionRestarts)
	}
	var connect *pgconn.ConnectError
	return errors.As(err, &connect)
}
