package pglease

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// schemaStatements is the DDL Migrate runs, in order.
var schemaStatements = []string{sqlstmt.CreateSequence, sqlstmt.CreateTable, sqlstmt.CreateRuns, sqlstmt.CreateRunsIndex}

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
	var b strings.Builder
	for _, stmt := range schemaStatements {
		b.WriteString(t.Render(stmt))
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// Migrate creates the fence sequence and the lease table if they do not
// exist, and purges rows expired longer ago than the retention (Retention,
// or WithRetention). It is idempotent and safe to run on many replicas at
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
	err := driver.OnOneConnection(ctx, db, func(db driver.DB) error { return migrate(ctx, db, t, cfg) })
	if err != nil {
		// Whatever statement the end of ctx cut short, the error names
		// the cause (a 57014 alone does not say it was ctx's).
		return fmt.Errorf("pglease: migrate %s: %w", t, explainPrivilege(driver.WithCause(ctx, err)))
	}
	return nil
}

func migrate(ctx context.Context, db DB, t driver.Table, cfg config) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, sqlstmt.MigrateLock, migrateLockKey(t)); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	for _, stmt := range schemaStatements {
		if _, err := tx.Exec(ctx, t.Render(stmt)); err != nil {
			return err
		}
	}
	var missing string
	if err := tx.QueryRow(ctx, sqlstmt.MissingColumns, t.Name.Sanitize()).Scan(&missing); err != nil {
		return fmt.Errorf("looking for the columns added since the table was made: %w", err)
	}
	if missing != "" {
		if _, err := tx.Exec(ctx, t.Render(sqlstmt.AddColumns)); err != nil {
			return fmt.Errorf("adding the columns %s: %w", missing, err)
		}
	}
	if err := driver.CheckTable(ctx, tx, t, driver.Migrating); err != nil {
		return err
	}
	if _, err := purge(ctx, tx, t, cfg.retention); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	return driver.Confirmed(ctx, tx.Commit(ctx))
}

// purge runs sqlstmt.Purge and returns how many rows it deleted, then
// deletes the runs of the ledger started as long ago, if the table has a
// ledger. The callers have checked the horizon against MinRetention.
func purge(ctx context.Context, db DB, t driver.Table, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, t.Render(sqlstmt.Purge), olderThan.Seconds())
	if err := driver.Confirmed(ctx, err); err != nil {
		return 0, err
	}
	var ledger bool
	if err := db.QueryRow(ctx, sqlstmt.HasRuns, sqlstmt.Runs(t.Name).Sanitize()).Scan(&ledger); err != nil {
		return 0, fmt.Errorf("looking for the ledger of runs: %w", err)
	}
	if ledger {
		_, err := db.Exec(ctx, t.Render(sqlstmt.PurgeRuns), olderThan.Seconds())
		if err := driver.Confirmed(ctx, err); err != nil {
			return 0, fmt.Errorf("purging the ledger of runs: %w", err)
		}
	}
	return tag.RowsAffected(), nil
}

// migrateLockKey derives the advisory lock key from the table name.
func migrateLockKey(t driver.Table) int64 {
	h := fnv.New64a()
	h.Write([]byte("pglease.migrate:" + t.Name.Sanitize()))
	return int64(h.Sum64())
}

// explainPrivilege adds what to do to a permission error (SQLSTATE 42501):
// the runtime role is not meant to run Migrate.
func explainPrivilege(err error) error {
	if driver.Is(err, driver.InsufficientPrivilege) {
		return fmt.Errorf("%w (Migrate needs CREATE on the schema, DELETE on the table and to own the ledger of runs beside it: run it as the table's owner, or apply Schema() with your migration tool and give the runtime role only SELECT, INSERT, UPDATE on the table and its ledger and USAGE on the sequence)", err)
	}
	return err
}
