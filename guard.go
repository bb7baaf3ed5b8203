package pglease

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/driver"
)

// Guard makes tx commit only while this lease is the key's current lease: it
// checks the lease row in tx, by the server's clock, and locks it in share
// mode until tx ends. Call it last, right before the commit, in the
// outermost transaction. Every error it returns (wrapping ErrLost when the
// lease is not current) leaves tx aborted. See docs/GUIDE.md, "Lease.Guard".
func (ls *Lease) Guard(ctx context.Context, tx pgx.Tx) error {
	mustContext(ctx, "Guard")
	if driver.IsNilTx(tx) {
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
		return driver.Refuse(ctx, tx, err, ls.terms.timeout)
	}
	return nil
}

// guard checks ls's lease in tx; every error it returns makes Guard
// abort tx (driver.Refuse).
func (ls *Lease) guard(ctx context.Context, tx pgx.Tx) error {
	if err := ls.Err(); err != nil {
		if errors.Is(err, ErrLost) {
			return fmt.Errorf("pglease: guard %q fence %d: %w", ls.key, ls.fence, err)
		}
		return fmt.Errorf("pglease: guard %q fence %d: %w: %w", ls.key, ls.fence, err, ErrLost)
	}
	t, _ := driver.ParseTable(ls.locker.cfg.table) // checked by newConfig
	err := driver.Guard(ctx, tx, t, driver.GuardLease{Key: ls.key, Holder: ls.holder, Fence: ls.fence, Table: ls.table, Unfenced: ls.locker.cfg.noFence})
	switch {
	case err == nil:
		return nil
	case driver.Is(err, driver.DivisionByZero): // the guard statement matched no row
		why := ls.locker.lossesOf(ctx, ls.locker.conns.ClaimRead(), []*Lease{ls}, func(int) bool { return true })[0]
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
