// Command sqltx shows pglease on database/sql: a Locker on a *sql.DB
// (pglease.SQL) and a plain *sql.Tx fenced by its lease (Lease.GuardSQL),
// as a service on GORM, sqlx, ent or bun would use them.
//
// With no configuration it starts a throwaway PostgreSQL (or uses
// PGLEASE_DATABASE_URL). Replica "a" claims the job's key and commits a
// guarded write; then its Locker stops and its lease ends, replica "b"
// takes the key over and commits its own, and a late write of a's, still
// holding the old lease, is refused with ErrLost and rolled back. It prints
// the ledger and exits 1 if a stale write landed.
//
//	go run ./examples/sqltx
//	go run ./examples/sqltx -driver pgx   # pgx's stdlib driver instead of lib/pq
//	go run ./examples/sqltx -dsn postgres://...
package main

import (
	"context"
	"database/sql"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver
	_ "github.com/lib/pq"              // the "postgres" driver

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
)

func main() { os.Exit(run(context.Background(), os.Args[1:], os.Stdout, os.Stderr)) }

// run is the whole program; it returns the exit code: 0, 1 when a stale
// write landed or the demo could not run, 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("sqltx", flag.ContinueOnError)
	fs.SetOutput(stderr)
	dsn := fs.String("dsn", "", "PostgreSQL to use (default: PGLEASE_DATABASE_URL, or a throwaway server)")
	drv := fs.String("driver", "postgres", "database/sql driver: postgres (lib/pq) or pgx (pgx's stdlib)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if *dsn == "" {
		srv, err := pgserver.Start(ctx, pgserver.Options{})
		if err != nil {
			fmt.Fprintln(stderr, err)
			return 1
		}
		defer srv.Close()
		*dsn = srv.DSN()
	}
	if err := demo(ctx, *drv, *dsn, stdout); err != nil {
		fmt.Fprintln(stderr, err)
		return 1
	}
	return 0
}

func demo(ctx context.Context, driver, dsn string, out io.Writer) error {
	db, err := sql.Open(driver, dsn)
	if err != nil {
		return err
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	leases := pglease.SQL(db)
	const table = "sqltx_leases"
	if err := pglease.Migrate(ctx, leases, pglease.WithTable(table)); err != nil {
		return err
	}
	if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS sqltx_ledger;
		CREATE TABLE sqltx_ledger (holder text NOT NULL, fence bigint NOT NULL)`); err != nil {
		return err
	}
	locker := func(holder string) *pglease.Locker {
		return pglease.NewLocker(leases, pglease.WithTable(table), pglease.WithHolder(holder),
			pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
	}
	a, b := locker("a"), locker("b")
	defer a.Close(ctx)
	defer b.Close(ctx)

	la, err := a.Claim(ctx, "nightly-report")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "a claims the job (fence %d); its write: %v\n", la.Fence(), write(ctx, db, la))
	// a's Locker stops and its lease ends; b takes over.
	a.Close(ctx)
	lb, err := b.ClaimWait(ctx, "nightly-report")
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "b takes over (fence %d); its write: %v\n", lb.Fence(), write(ctx, db, lb))
	stale := write(ctx, db, la)
	fmt.Fprintf(out, "a wakes up and writes again: lost=%v\n", errors.Is(stale, pglease.ErrLost))

	rows, err := db.QueryContext(ctx, `SELECT holder, fence FROM sqltx_ledger ORDER BY fence`)
	if err != nil {
		return err
	}
	defer rows.Close()
	n := 0
	for rows.Next() {
		var holder string
		var fence int64
		if err := rows.Scan(&holder, &fence); err != nil {
			return err
		}
		n++
		name, _, _ := strings.Cut(holder, "#") // a Locker stores its WithHolder name and a suffix of its own
		fmt.Fprintf(out, "ledger: %s fence %d\n", name, fence)
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if stale == nil || n != 2 {
		return fmt.Errorf("a stale write landed: %d ledger rows, a's late write returned %w", n, stale)
	}
	return nil
}

// write appends one ledger row for lease in a database/sql transaction,
// guarded last: it commits only while lease is the key's current lease.
func write(ctx context.Context, db *sql.DB, lease *pglease.Lease) error {
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback() }() // a no-op once committed
	if _, err := tx.ExecContext(ctx, `INSERT INTO sqltx_ledger VALUES ($1, $2)`, lease.Holder(), lease.Fence()); err != nil {
		return err
	}
	if err := lease.GuardSQL(ctx, tx); err != nil {
		return err
	}
	return tx.Commit()
}
