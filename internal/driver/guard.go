package driver

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// GuardLease is the lease a Guard checks: its row matched by key and
// fence (or, Unfenced, by its forged holder alone) in the table of oid
// Table.
type GuardLease struct {
	Key      string
	Holder   string
	Fence    int64
	Table    uint32
	Unfenced bool
}

// Guard sends the guard statement of t (sqlstmt.Guard, or
// sqlstmt.UnfencedGuard) on tx: nil while m is the key's current lease;
// a server error of class DivisionByZero when it is not. A wrapper around
// a nil transaction, which passes IsNilTx and then panics inside, is a nil
// tx too.
func Guard(ctx context.Context, tx pgx.Tx, t Table, m GuardLease) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.New("tx is nil (a wrapper around a nil transaction): Guard needs the open transaction whose commit it guards")
		}
	}()
	stmt, args := sqlstmt.Guard, []any{m.Key, m.Holder, m.Fence, m.Table}
	if m.Unfenced {
		stmt, args = sqlstmt.UnfencedGuard, []any{m.Key, m.Holder, m.Table}
	}
	var one int
	err = tx.QueryRow(ctx, t.Render(stmt), args...).Scan(&one)
	if ctx.Err() != nil {
		// pgx may have sent a cancel request for it, which could land on a
		// later statement of the connection, a claim's among them: tx
		// cannot commit, and its connection is used no more.
		closeConnOf(tx)
		if err == nil {
			err = fmt.Errorf("its context ended while the guard statement ran: %w", context.Cause(ctx))
		}
	}
	return err
}

// closeConnOf closes the connection under tx, when pglease can reach it
// (a pgx transaction; not database/sql's).
func closeConnOf(tx pgx.Tx) {
	if conn := connOf(tx); conn != nil {
		cctx, cancel := context.WithTimeout(context.Background(), AnswerGrace)
		_ = conn.Close(cctx)
		cancel()
	}
}

// Refuse leaves tx aborted after a Guard failed with err, and returns err:
// a failure the server raised in tx has aborted it already, and so has a
// closed connection under tx; any other (the
// lease had ended, the context ended before the statement went out, the
// reply was lost, the connection is busy with a result set still open) is
// made to abort it by sqlstmt.GuardRefused, sent even if ctx has ended,
// within timeout. When the server does not answer that with its error, the
// refusal may not have been sent, and tx is ended under its caller
// (endTx), as the error then says.
func Refuse(ctx context.Context, tx pgx.Tx, err error, timeout time.Duration) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	if conn := connOf(tx); conn != nil && conn.IsClosed() {
		return fmt.Errorf("%w (the connection under tx is closed: tx cannot commit)", err) // as Guard leaves it when its context ended
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), timeout)
	defer cancel()
	rerr := execGuard(rctx, tx, sqlstmt.GuardRefused)
	if rctx.Err() != nil {
		closeConnOf(tx) // as in Guard: a cancel request may be on its way
	}
	if errors.As(rerr, &pgErr) || errors.Is(rerr, pgx.ErrTxClosed) {
		return err // refused by the server, or tx had ended
	}
	return fmt.Errorf("%w (the refusal could not be sent on tx: %w; %s)", err, rerr, endTx(rctx, tx))
}

// endTx makes tx unable to commit when the refusal could not be sent on it,
// and says how: a pgx transaction's connection is closed (the server rolls
// back what it never saw committed, savepoints and outer transaction
// alike); a database/sql one (GuardSQL) is rolled back, after which
// database/sql refuses its commit.
func endTx(ctx context.Context, tx pgx.Tx) string {
	if conn := connOf(tx); conn != nil {
		_ = conn.Close(ctx)
		return "Guard closed the connection under tx, which cannot commit"
	}
	if s, ok := tx.(*SQLTx); ok {
		_ = s.Rollback(ctx)
		return "GuardSQL rolled tx back, and its commit fails"
	}
	if rerr := rollbackGuard(ctx, tx); rerr != nil {
		return fmt.Sprintf("its rollback failed too (%v): roll tx back, never commit it", rerr)
	}
	return "Guard rolled tx back"
}

// rollbackGuard rolls tx back, as execGuard sends a statement on it.
func rollbackGuard(ctx context.Context, tx pgx.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.New("tx is nil (a wrapper around a nil transaction)")
		}
	}()
	return tx.Rollback(ctx)
}

// connOf is tx's connection, or nil when tx has none to give.
func connOf(tx pgx.Tx) (conn *pgx.Conn) {
	defer func() {
		if recover() != nil {
			conn = nil
		}
	}()
	return tx.Conn()
}

// execGuard sends stmt on tx, a wrapper around a nil transaction being a
// nil tx.
func execGuard(ctx context.Context, tx pgx.Tx, stmt string) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.New("tx is nil (a wrapper around a nil transaction)")
		}
	}()
	_, err = tx.Exec(ctx, stmt)
	return err
}

// IsNilTx reports whether tx is nil, or a nil pointer in the interface.
func IsNilTx(tx pgx.Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
