package driver

import (
	"context"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// schemaStatements is the DDL Migrate runs, in order.
var schemaStatements = []string{sqlstmt.CreateSequence, sqlstmt.CreateTable, sqlstmt.CreateRuns, sqlstmt.CreateRunsIndex}

// Schema is the DDL Migrate runs for t, each statement ending in ";\n".
func Schema(t Table) string {
	var b strings.Builder
	for _, stmt := range schemaStatements {
		b.WriteString(t.Render(stmt))
		b.WriteString(";\n")
	}
	return b.String()
}

// Migrate creates what Schema says if it does not exist, adds the columns
// added since the table was made, checks the table (CheckTable,
// Migrating) and purges rows expired longer ago than retention (Purge),
// in one transaction on one connection of db, under a transaction-scoped
// advisory lock of the table's name. Its commit is confirmed (Confirmed).
func Migrate(ctx context.Context, db DB, t Table, retention time.Duration) error {
	return OnOneConnection(ctx, db, func(db DB) (err error) {
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
		if err := CheckTable(ctx, tx, t, Migrating); err != nil {
			return err
		}
		if _, err := purge(ctx, tx, t, retention); err != nil {
			return fmt.Errorf("purge: %w", err)
		}
		return Confirmed(ctx, tx.Commit(ctx))
	})
}

// migrateLockKey derives the advisory lock key from the table name.
func migrateLockKey(t Table) int64 {
	h := fnv.New64a()
	h.Write([]byte("pglease.migrate:" + t.Name.Sanitize()))
	return int64(h.Sum64())
}
