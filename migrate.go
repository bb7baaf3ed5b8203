package pglease

import (
	"context"
	"errors"
	"fmt"

	"github.com/pglease/pglease/internal/driver"
)

// Schema returns the DDL that Migrate runs for the table its options name
// (WithTable), for migration tools (goose, golang-migrate, atlas); schema.sql
// is Schema() with the grants the runtime role needs.
func Schema(opts ...Option) (string, error) {
	cfg := defaults()
	cfg.apply(atSchema, opts)
	if err := errors.Join(cfg.errs...); err != nil {
		return "", err
	}
	t, _ := driver.ParseTable(cfg.table)
	return driver.Schema(t), nil
}

// Migrate creates the fence sequence and the lease table if they do not
// exist, and purges rows expired longer ago than the retention (24h, or
// WithRetention). It is idempotent and safe to run on many replicas at
// once. It refuses, naming the fix, an existing table or sequence that could
// lose rows or hand out a smaller fence. See docs/GUIDE.md, "Migrate".
func Migrate(ctx context.Context, db DB, opts ...Option) error {
	mustContext(ctx, "Migrate")
	if isNil(db) {
		return errors.New("pglease: migrate: db is nil")
	}
	cfg := defaults()
	cfg.apply(atMigrate, opts)
	if err := errors.Join(cfg.errs...); err != nil {
		return err
	}
	t, _ := driver.ParseTable(cfg.table)
	if err := driver.Migrate(ctx, db, t, cfg.retention); err != nil {
		// Whatever statement the end of ctx cut short, the error names
		// the cause (a 57014 alone does not say it was ctx's).
		return fmt.Errorf("pglease: migrate %s: %w", t, explainPrivilege(driver.WithCause(ctx, err)))
	}
	return nil
}

// explainPrivilege adds what to do to a permission error (SQLSTATE 42501):
// the runtime role is not meant to run Migrate.
func explainPrivilege(err error) error {
	if driver.Is(err, driver.InsufficientPrivilege) {
		return fmt.Errorf("%w (Migrate needs CREATE on the schema, DELETE on the table and to own the ledger of runs beside it: run it as the table's owner, or apply Schema() with your migration tool and give the runtime role only SELECT, INSERT, UPDATE on the table and its ledger and USAGE on the sequence)", err)
	}
	return err
}
