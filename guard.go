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

// Guard makes tx commit only while this lease is the key's current lease:
// it checks, in tx and by the server's clock, that the lease row is still
// this lease's (key, holder, fence, not expired), and locks the row in
// share mode until tx ends. No claim can take the key over before tx
// commits or rolls back, so nothing tx writes to this database can commit
// after a later lease of the key began. It returns an error wrapping
// ErrLost when the lease is no longer current, and tx is then aborted: its
// commit can only roll back.
//
// Use it last: do the writes, call Guard, commit. The lock is held from
// Guard to the end of tx, and while it is held this row's heartbeat waits
// (or skips it), as does every other replica's claim of the key. Keep the
// span from Guard to commit short, and well under the TTL minus the
// heartbeat interval: a lease whose heartbeat cannot reach its row before
// its trust deadline is lost locally. Even then tx still commits safely
// (no claim could take the row while it was locked), but the job's other
// effects are no longer covered by any lease.
//
// Every error Guard returns leaves tx aborted, whatever the cause: the row
// no longer matched, the lease had already ended locally (lost, released,
// or its Locker closed: ErrLost without checking the row), ctx ended, or
// the reply was lost. A caller that ignores the error and commits gets a
// rollback. When tx cannot take the statement that aborts it (its
// connection is busy with a result set still open, or broken), Guard
// closes the connection under tx (GuardSQL rolls tx back), and its error
// says so. Only a tx that had already ended, or a nil one, is left as it
// is. Guard does not end the lease itself when the row no longer matches:
// the heartbeat does.
//
// Call Guard in the outermost transaction, or in a savepoint (a pgx nested
// transaction) that is released (committed), never in one that is then
// rolled back: PostgreSQL releases the row locks of a rolled-back
// savepoint, and the guard with them. For the same reason the abort that a
// lost lease causes holds only in the outermost transaction: a savepoint
// rolled back after a failed Guard (pgx.BeginFunc on a Tx does that on any
// error) clears it, and the outer commit then lands unless its caller
// heeded the error. Do not Unlock the lease before the guarded transaction
// ends: its row stays locked until then, and the release waits for it.
//
// Under REPEATABLE READ or SERIALIZABLE, a heartbeat that extended the row
// after tx took its snapshot makes Guard fail with a serialization failure
// (SQLSTATE 40001, wrapped and kept): retry the whole transaction, as for
// any 40001. Begin such a transaction after the claim: a snapshot older than
// the claim does not see this lease's row, and Guard then reports ErrLost.
//
// Across a failover to a synchronous standby: Guard's statement commits
// nothing itself, and a commit of tx that the standby confirmed carries the
// lease row as Guard saw it (the standby has every commit before it). A
// commit of tx whose wait for the standby was cut short (a cancel request
// as its context ended: the driver reports success, with a WARNING) may be
// lost in the failover with all it wrote; read it as an unknown outcome,
// as the Locker reads its own.
//
// Guard works on a Locker's leases, in WithoutFenceColumn mode too, and on
// an Elector's leadership lease.
func (ls *Lease) Guard(ctx context.Context, tx pgx.Tx) error {
	mustContext(ctx, "Guard")
	if isNilTx(tx) {
		return fmt.Errorf("pglease: guard %q fence %d: tx is nil: Guard needs the open transaction whose commit it guards", ls.key, ls.fence)
	}
	return ls.guardTx(ctx, tx)
}

// GuardSQL is Guard for a database/sql transaction (of GORM, sqlx, ent,
// bun or plain database/sql: they all expose the *sql.Tx), on pgx's stdlib
// driver or lib/pq: the same check in tx, the same row lock until tx ends,
// the same ErrLost, and every error it returns leaves tx aborted, so that
// its commit fails.
//
//	if err := lease.GuardSQL(ctx, tx); err != nil { ... } // then tx.Commit()
//
// Call it last, just before tx.Commit, as Guard. The lease may come from a
// Locker on any DB: SQL, or a *pgxpool.Pool on the same database. The
// guard statement goes in one message, its arguments in its text (see
// SQL), whatever the driver of tx, which a *sql.Tx does not reveal: so
// that a guard whose ctx ends while it waits on the row is cancelled on
// lib/pq too.
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

// guard checks ls's mandate in tx; every error it returns makes Guard
// abort tx (refuse).
func (ls *Lease) guard(ctx context.Context, tx pgx.Tx) error {
	if err := ls.Err(); err != nil {
		if errors.Is(err, ErrLost) {
			return fmt.Errorf("pglease: guard %q fence %d: %w", ls.key, ls.fence, err)
		}
		return fmt.Errorf("pglease: guard %q fence %d: %w: %w", ls.key, ls.fence, err, ErrLost)
	}
	var one int
	err := queryGuard(ctx, tx, ls.locker.guardSQL(), ls.guardArgs()...).Scan(&one)
	switch {
	case err == nil:
		return nil
	case driver.Is(err, driver.DivisionByZero): // guardSQL matched no row
		return fmt.Errorf("pglease: guard %q fence %d: row re-claimed by a later lease or lapsed: %w", ls.key, ls.fence, ErrLost)
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

// guardSQL renders the guard statement of this Locker's protocol. It is
// rendered per call, a microsecond beside the round trip, rather than kept
// in the Locker.
func (l *Locker) guardSQL() string {
	t, _ := parseTable(l.cfg.table) // checked by newConfig
	if l.cfg.noFence {
		return t.render(sqlstmt.UnfencedGuard)
	}
	return t.render(sqlstmt.Guard)
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
			row = errRow{errors.New("tx is nil (a wrapper around a nil transaction): Guard needs the open transaction whose commit it guards")}
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

// errRow is a row that failed before its statement was sent.
type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }
