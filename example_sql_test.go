package pglease_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	_ "github.com/lib/pq" // the "postgres" driver; pgx's stdlib ("pgx") works the same

	"github.com/pglease/pglease"
)

// A service on database/sql (GORM, sqlx, ent and bun all expose the
// *sql.DB and *sql.Tx under them): the Locker takes the *sql.DB through
// pglease.SQL, and GuardSQL fences a plain *sql.Tx, called last, right
// before the commit.
func ExampleLease_GuardSQL() {
	ctx := context.Background()
	db, err := sql.Open("postgres", databaseURL())
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8) // claims may hold 7: one is left for the heartbeat

	leases := pglease.SQL(db)
	if err := pglease.Migrate(ctx, leases, pglease.WithTable("example_sql")); err != nil {
		panic(err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_sql_report (day date PRIMARY KEY, total bigint NOT NULL)`); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(leases, pglease.WithTable("example_sql"))
	defer locker.Close(ctx)

	lease, err := locker.Claim(ctx, "daily-report")
	if err != nil {
		panic(err)
	}
	err = func() error {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op once committed
		if _, err := tx.ExecContext(ctx, `INSERT INTO example_sql_report VALUES ('2024-01-31', 42)
			ON CONFLICT (day) DO UPDATE SET total = EXCLUDED.total`); err != nil {
			return err
		}
		if err := lease.GuardSQL(ctx, tx); err != nil {
			return err // tx can only roll back now
		}
		return tx.Commit()
	}()
	switch {
	case errors.Is(err, pglease.ErrLost):
		fmt.Println("lease lost: nothing was written")
	case err != nil:
		panic(err)
	default:
		fmt.Println("report written under fence", lease.Fence() > 0)
	}
	// Output: report written under fence true
}
