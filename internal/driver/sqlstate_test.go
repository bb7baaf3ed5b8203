package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"
)

func server(code, msg string) error {
	return fmt.Errorf("sent: %w", &pgconn.PgError{Code: code, Message: msg})
}

func TestSQLState(t *testing.T) {
	t.Parallel()
	live := context.Background()
	ended, cancel := context.WithCancel(context.Background())
	cancel()
	cases := []struct {
		name string
		got  bool
		want bool
	}{
		{"IsFindsAWrappedCode", Is(server(SerializationFailure, ""), SerializationFailure), true},
		{"IsTellsCodesApart", Is(server(SerializationFailure, ""), LockNotAvailable), false},
		{"IsNeedsAServerError", Is(errors.New("40001"), SerializationFailure), false},
		{"StatementTimeoutWhileTheCallerWaits", StatementTimedOut(live, server(QueryCanceled, "")), true},
		{"CancelOfTheCallerIsNoStatementTimeout", StatementTimedOut(ended, server(QueryCanceled, "")), false},
		{"RowErrorOfAConstraint", RowError(live, server("23505", "")), true},
		{"RowErrorOfAValue", RowError(live, server(StringTooLong, "")), true},
		{"RowErrorOfADeadlock", RowError(live, server("40P01", "")), true},
		{"RowErrorOfALockWait", RowError(live, server(LockNotAvailable, "")), true},
		{"RowErrorOfAStatementTimeout", RowError(live, server(QueryCanceled, "")), true},
		{"NoRowErrorWhenTheCallerGaveUp", RowError(ended, server(QueryCanceled, "")), false},
		{"NoRowErrorOfAMissingTable", RowError(live, server(UndefinedTable, "")), false},
		{"NoRowErrorOfAClientError", RowError(live, errors.New("conn closed")), false},
		{"PoolerDuplicatePrepared", PreparedStatementMismatch(server(DuplicatePreparedStatement, "")), true},
		{"PoolerMissingPrepared", PreparedStatementMismatch(server(InvalidStatementName, `prepared statement "s1" does not exist`)), true},
		{"PoolerUnnamedPrepared", PreparedStatementMismatch(server(ProtocolViolation, "bind message supplies 2 parameters, but prepared statement \"\" requires 1")), true},
		{"OtherProtocolViolation", PreparedStatementMismatch(server(ProtocolViolation, "invalid message format")), false},
		{"RestartAdminShutdown", ServerRestarting(server("57P01", "")), true},
		{"RestartCannotConnectNow", ServerRestarting(server("57P03", "")), true},
		{"RestartConnectError", ServerRestarting(&pgconn.ConnectError{}), true},
		{"NoRestartOnQueryCanceled", ServerRestarting(server(QueryCanceled, "")), false},
		{"NoRestartOnAClientError", ServerRestarting(errors.New("conn closed")), false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if tc.got != tc.want {
				t.Errorf("got %v, want %v", tc.got, tc.want)
			}
		})
	}
	if Code(nil) != "" || Code(server(UndefinedTable, "")) != UndefinedTable {
		t.Errorf("Code: got %q and %q", Code(nil), Code(server(UndefinedTable, "")))
	}
}

// Every statement's success is classified: a nil error costs no
// allocation (errors.As's target, which escapes, is made only for an
// error).
func TestSQLStateOfSuccessAllocatesNothing(t *testing.T) {
	n := testing.AllocsPerRun(100, func() {
		_ = Code(nil)
		_ = PreparedStatementMismatch(nil)
		_ = ServerRestarting(nil)
		_ = OutcomeOf(nil)
		_ = sqlError(nil)
	})
	if n != 0 {
		t.Errorf("classifying a nil error allocates %v times", n)
	}
}

// asServerError is a wrapper that finds a server error by its As method
// alone.
type asServerError struct{ pgErr *pgconn.PgError }

func (e asServerError) Error() string { return "as: " + e.pgErr.Message }

func (e asServerError) As(target any) bool {
	if p, ok := target.(**pgconn.PgError); ok {
		*p = e.pgErr
		return true
	}
	return false
}

// TestServerError checks, with no server, that serverError finds what
// errors.As finds in every shape of chain.
func TestServerError(t *testing.T) {
	t.Parallel()
	first := &pgconn.PgError{Code: LockNotAvailable, Message: "first"}
	second := &pgconn.PgError{Code: SerializationFailure, Message: "second"}
	for _, tc := range []struct {
		name string
		err  error
	}{
		{"nil", nil},
		{"none", errors.New("no row")},
		{"itself", first},
		{"wrapped twice", fmt.Errorf("b: %w", fmt.Errorf("a: %w", first))},
		{"joined after another error", errors.Join(errors.New("x"), fmt.Errorf("a: %w", second), first)},
		{"two %w, the first without one", fmt.Errorf("%w and %w", errors.New("x"), second)},
		{"by its As method", fmt.Errorf("a: %w", asServerError{first})},
		{"joined, none", errors.Join(errors.New("x"), errors.New("y"))},
	} {
		var want *pgconn.PgError
		wantOK := errors.As(tc.err, &want)
		got, ok := serverError(tc.err)
		if ok != wantOK || got != want {
			t.Errorf("%s: serverError found %v, %v; errors.As finds %v, %v", tc.name, got, ok, want, wantOK)
		}
	}
}

// TestSQLStateOfAnErrorWithoutOneAllocatesNothing: a losing claim's error
// (pgx.ErrNoRows) is asked about at every losing claim.
func TestSQLStateOfAnErrorWithoutOneAllocatesNothing(t *testing.T) {
	noRow := fmt.Errorf("claim: %w", errors.New("no rows in result set"))
	if n := testing.AllocsPerRun(100, func() { _ = Code(noRow) }); n != 0 {
		t.Errorf("asking about an error without a server error allocates %v times", n)
	}
}
