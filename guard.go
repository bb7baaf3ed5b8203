package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"reflect"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// Guard makes tx commit only while this lease is the key's current lease: it
// checks the lease row in tx, by the server's clock, and locks it in share
// mode until tx ends. Call it last, right before the commit, in the
// outermost transaction. Every error it returns (wrapping ErrLost when the
// lease is not current) leaves tx aborted. See docs/GUIDE.md, "Lease.Guard".
func (ls *Lease) Guard(ctx context.Context, tx pgx.Tx) error {
	mustContext(ctx, "Guard")
	if isNilTx(tx) {
		return fmt.Errorf("pglease: guard %q fence %d: tx is nil: Guard needs the open transaction whose commit it guards", ls.key, ls.fence)
	}
	return ls.guardTx(ctx, tx)
}

// GuardSQL is Guard for a *sql.Tx (GORM, sqlx, ent, bun) on pgx's stdlib
// driver or lib/pq: the same check, lock and errors, and tx aborted on every
// error.
func (ls *Lease) GuardSQL(ctx context.Context, tx *sql.Tx) error {
	mustContext(ctx, "GuardSQL")
	if tx == nil {
		return fmt.Errorf("pglease: guard %q fence %d: tx is nil: GuardSQL needs the open transaction whose commit it guards", ls.key, ls.fence)
	}
	return ls.guardTx(ctx, driver.NewSQLTx(tx))
}

// guardTx is Guard and GuardSQL once tx is known not to be nil.
func (ls *Lease) guardTx(ctx context.Context, tx pgx.Tx) error {
	if err := ls.guard(ctx, tx); err != nil {
		return ls.refuse(ctx, tx, err)
	}
	return nil
}

// guard checks ls's lease in tx; every error it returns makes Guard
// abort tx (refuse).
func (ls *Lease) guard(ctx context.Context, tx pgx.Tx) error {
	if err := ls.Err(); err != nil {
		if errors.Is(err, ErrLost) {
			return fmt.Errorf("pglease: guard %q fence %d: %w", ls.key, ls.fence, err)
		}
		return fmt.Errorf("pglease: guard %q fence %d: %w: %w", ls.key, ls.fence, err, ErrLost)
	}
	var one int
	err := queryGuard(ctx, tx, guardSQL(&ls.locker.cfg), ls.guardArgs()...).Scan(&one)
	switch {
	case err == nil:
		return nil
	case driver.Is(err, driver.DivisionByZero): // guardSQL matched no row
		why := ls.locker.lossesOf(ctx, ls.locker.conns.ClaimRead(), []*Lease{ls}, func(*Lease) bool { return true })[ls]
		return fmt.Errorf("pglease: guard %q fence %d: the server refused it: %s: %w", ls.key, ls.fence, why.why, why.sentinel)
	case errors.Is(err, pgx.ErrTxClosed):
		return fmt.Errorf("pglease: guard %q fence %d: tx has already been committed or rolled back: %w", ls.key, ls.fence, err)
	case driver.Is(err, driver.InFailedTransaction):
		return fmt.Errorf("pglease: guard %q fence %d: tx is aborted by an earlier error, roll it back: %w", ls.key, ls.fence, err)
	case driver.Is(err, driver.SerializationFailure):
		return fmt.Errorf("pglease: guard %q fence %d: the row changed after this transaction's snapshot (a heartbeat, under REPEATABLE READ or SERIALIZABLE): retry the transaction: %w", ls.key, ls.fence, err)
	}
	return fmt.Errorf("pglease: guard %q fence %d: %w", ls.key, ls.fence, err)
}

// refuse leaves tx aborted after Guard failed with err, and returns err:
// a failure the server raised in tx has aborted it already; any other (the
// lease had ended, the context ended before the statement went out, the
// reply was lost, the connection is busy with a result set still open) is
// made to abort it by sqlstmt.GuardRefused, sent even if ctx has ended,
// within the lease's timeout. When the server does not answer that with its
// error, the refusal may not have been sent, and tx is ended under its
// caller (endTx), as the error then says.
func (ls *Lease) refuse(ctx context.Context, tx pgx.Tx, err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) || errors.Is(err, pgx.ErrTxClosed) {
		return err
	}
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), ls.terms.timeout)
	defer cancel()
	_, rerr := execGuard(rctx, tx, sqlstmt.GuardRefused)
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
	if s, ok := tx.(*driver.SQLTx); ok {
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

// guardSQL renders the guard statement of the protocol c configures. It is
// rendered per call, a microsecond beside the round trip, rather than kept
// in the Locker.
func guardSQL(c *config) string {
	t, _ := driver.ParseTable(c.table) // checked by newConfig
	if c.noFence {
		return t.Render(sqlstmt.UnfencedGuard)
	}
	return t.Render(sqlstmt.Guard)
}

func (ls *Lease) guardArgs() []any {
	if ls.locker.cfg.noFence {
		return []any{ls.key, ls.holder, ls.table}
	}
	return []any{ls.key, ls.holder, ls.fence, ls.table}
}

// queryGuard sends the guard statement on tx. A wrapper around a nil
// transaction passes isNilTx and then panics inside; that is a nil tx too.
func queryGuard(ctx context.Context, tx pgx.Tx, sql string, args ...any) (row pgx.Row) {
	defer func() {
		if r := recover(); r != nil {
			row = driver.ErrRow{Err: errors.New("tx is nil (a wrapper around a nil transaction): Guard needs the open transaction whose commit it guards")}
		}
	}()
	return tx.QueryRow(ctx, sql, args...)
}

// execGuard sends stmt on tx, as queryGuard does.
func execGuard(ctx context.Context, tx pgx.Tx, stmt string) (tag pgconn.CommandTag, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = errors.New("tx is nil (a wrapper around a nil transaction)")
		}
	}()
	return tx.Exec(ctx, stmt)
}

func isNilTx(tx pgx.Tx) bool {
	if tx == nil {
		return true
	}
	v := reflect.ValueOf(tx)
	return v.Kind() == reflect.Pointer && v.IsNil()
}
