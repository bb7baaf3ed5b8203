package pglease

import (
	"context"
	_ "embed" // SchemaSQL
	"errors"
	"fmt"
	"hash/fnv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// createSequenceSQL makes the sequence that issues fences. A sequence, not
// fence + 1: the fence then grows on every claim of a key, re-entrant ones
// included, and does not restart at 1 when a purged key is claimed again.
const createSequenceSQL = `CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint`

// createTableSQL makes the lease table. One row per key, updated in place
// for its whole life. There is deliberately no index on expires_at: without
// it every claim, heartbeat and release is a HOT update and the table stays
// a few pages forever. The table stays LOGGED: a claim must survive a crash
// or fences could go backwards.
const createTableSQL = `CREATE TABLE IF NOT EXISTS {table} (
    key         text        PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT nextval({seqlit}),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    CHECK (expires_at > acquired_at)
)`

// purgeSQL deletes rows expired longer than the retention ago. It is the
// only DELETE pglease runs, in Migrate and Purge (and so `pglease purge`):
// only expired rows can match, so a live lease is never deleted, and a
// purged key that is claimed again gets its fence from the sequence, so it
// still grows. The retention is never below MinRetention: a claim that drew its fence before
// a later lease of the key was handed out would otherwise find the row gone
// and insert the smaller fence (see MinRetention).
const purgeSQL = `DELETE FROM {table} WHERE expires_at < clock_timestamp() - make_interval(secs => $1)`

// migrateLockSQL serializes concurrent Migrate calls on one table (two
// concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog).
// Transaction-scoped, so it also works behind PgBouncer in transaction mode.
const migrateLockSQL = `SELECT pg_advisory_xact_lock($1)`

// SchemaSQL is the content of schema.sql: the DDL that Migrate runs for the
// default table name, with a comment on the grants the runtime role needs,
// for teams that apply DDL with a migration tool (goose, golang-migrate,
// atlas) rather than from the service. For another table name use Schema.
//
//go:embed schema.sql
var SchemaSQL string

// schemaStatements is the DDL Migrate runs, in order.
var schemaStatements = []string{createSequenceSQL, createTableSQL}

// Schema returns the DDL that Migrate runs for the given options (only
// WithTable matters), as one SQL text for migration tools. Statements end
// with a semicolon.
func Schema(opts ...Option) (string, error) {
	cfg, err := newConfig(opts, forSchema)
	if err != nil {
		return "", err
	}
	t, _ := parseTable(cfg.table)
	var b strings.Builder
	for _, stmt := range schemaStatements {
		b.WriteString(t.render(stmt))
		b.WriteString(";\n")
	}
	return b.String(), nil
}

// Migrate creates the fence sequence and the lease table if they do not
// exist, then purges rows expired longer than the retention ago (Retention,
// or WithRetention, at least MinRetention). It runs in one transaction under a transaction-scoped
// advisory lock, so it is idempotent and safe when many replicas run it at
// once. The schema of a qualified table name must exist already. Migrate is
// the only code that runs DDL; at run time a Locker needs only SELECT,
// INSERT and UPDATE on the table and USAGE on its sequence.
func Migrate(ctx context.Context, db DB, opts ...Option) error {
	mustContext(ctx, "Migrate")
	if isNil(db) {
		return errors.New("pglease: migrate: db is nil")
	}
	cfg, err := newConfig(opts, forMigrate)
	if err != nil {
		return err
	}
	t, _ := parseTable(cfg.table)
	if err := migrate(ctx, db, t, cfg); err != nil {
		return fmt.Errorf("pglease: migrate %s: %w", t, explainPrivilege(err))
	}
	return nil
}

func migrate(ctx context.Context, db DB, t table, cfg config) (err error) {
	tx, err := db.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			_ = tx.Rollback(context.WithoutCancel(ctx))
		}
	}()
	if _, err := tx.Exec(ctx, migrateLockSQL, migrateLockKey(t)); err != nil {
		return fmt.Errorf("advisory lock: %w", err)
	}
	for _, stmt := range schemaStatements {
		if _, err := tx.Exec(ctx, t.render(stmt)); err != nil {
			return err
		}
	}
	if err := checkLogged(ctx, tx, t); err != nil {
		return err
	}
	if _, err := purge(ctx, tx, t, cfg.retention); err != nil {
		return fmt.Errorf("purge: %w", err)
	}
	return tx.Commit(ctx)
}

// purge runs purgeSQL and returns how many rows it deleted. The callers
// have checked the horizon against MinRetention.
func purge(ctx context.Context, db DB, t table, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, t.render(purgeSQL), olderThan.Seconds())
	if err != nil {
		return 0, err
	}
	return tag.RowsAffected(), nil
}

// unloggedSQL names the lease table or fence sequence if an operator made it
// UNLOGGED (ALTER TABLE ... SET UNLOGGED, ALTER SEQUENCE ... SET UNLOGGED)
// or it is TEMPORARY: a crash then empties it, and every live lease could
// be claimed again, or every fence issued again.
const unloggedSQL = `SELECT c.relname, c.relpersistence::text
  FROM pg_class c
 WHERE c.oid IN (to_regclass($1), to_regclass($2)) AND c.relpersistence <> 'p'`

// checkLogged refuses a lease table or fence sequence that a crash would
// empty, naming the fix: Migrate runs at every deploy, so it is where an
// operator's change is caught.
func checkLogged(ctx context.Context, tx DB, t table) error {
	rows, err := tx.Query(ctx, unloggedSQL, t.name.Sanitize(), t.seq.Sanitize())
	if err != nil {
		return fmt.Errorf("checking persistence: %w", err)
	}
	defer rows.Close()
	var problems []string
	for rows.Next() {
		var name, persistence string
		if err := rows.Scan(&name, &persistence); err != nil {
			return err
		}
		kind := "UNLOGGED"
		if persistence == "t" {
			kind = "TEMPORARY"
		}
		problems = append(problems, fmt.Sprintf("%s is %s", name, kind))
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if len(problems) > 0 {
		return fmt.Errorf("%s: a crash would empty it, and live leases could be claimed again or fences issued twice (ALTER TABLE %s SET LOGGED; ALTER SEQUENCE %s SET LOGGED)",
			strings.Join(problems, ", "), t.name.Sanitize(), t.seq.Sanitize())
	}
	return nil
}

// migrateLockKey derives the advisory lock key from the table name.
func migrateLockKey(t table) int64 {
	h := fnv.New64a()
	h.Write([]byte("pglease.migrate:" + t.name.Sanitize()))
	return int64(h.Sum64())
}

// explainPrivilege adds what to do to a permission error (SQLSTATE 42501):
// the runtime role is not meant to run Migrate.
func explainPrivilege(err error) error {
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42501" {
		return fmt.Errorf("%w (Migrate needs CREATE on the schema and DELETE on the table: run it as the table's owner, or apply Schema() with your migration tool and give the runtime role only SELECT, INSERT, UPDATE on the table and USAGE on the sequence)", err)
	}
	return err
}
