package orm_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	_ "github.com/jackc/pgx/v5/stdlib" // the "pgx" driver; lib/pq's "postgres" works the same
	"github.com/jmoiron/sqlx"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pglease/pglease"
)

// Report is the row the examples' job writes.
type Report struct {
	Day   string `gorm:"primaryKey"`
	Total int64
}

// sqlTxOf is the *sql.Tx under a GORM transaction (the tx that
// db.Transaction hands its function), for Lease.GuardSQL. GORM keeps it in
// tx.Statement.ConnPool: the *sql.Tx itself, or, with gorm.Config's
// PrepareStmt, a *gorm.PreparedStmtTX that wraps it, on which
// ConnPool.(*sql.Tx) alone fails.
func sqlTxOf(tx *gorm.DB) (*sql.Tx, error) {
	pool := tx.Statement.ConnPool
	if p, ok := pool.(*gorm.PreparedStmtTX); ok {
		pool = p.Tx
	}
	sqlTx, ok := pool.(*sql.Tx)
	if !ok {
		return nil, fmt.Errorf("not inside a GORM transaction on database/sql: ConnPool is %T", tx.Statement.ConnPool)
	}
	return sqlTx, nil
}

// GORM: the Locker runs on GORM's *sql.DB (pglease.SQL), and GuardSQL,
// called last in db.Transaction's function, makes its commit happen only
// while the lease is current. The same holds with PrepareStmt (sqlTxOf).
func Example_gorm() {
	ctx := context.Background()
	for _, prepare := range []bool{false, true} {
		db, err := gorm.Open(postgres.Open(databaseURL()), &gorm.Config{PrepareStmt: prepare, Logger: logger.Discard})
		if err != nil {
			panic(err)
		}
		sqlDB, err := db.DB() // gorm.io/driver/postgres runs on pgx's stdlib driver
		if err != nil {
			panic(err)
		}
		sqlDB.SetMaxOpenConns(8) // claims may hold 7: one is left for the heartbeat
		leases := pglease.SQL(sqlDB)
		if err := pglease.Migrate(ctx, leases, pglease.WithTable("example_gorm")); err != nil {
			panic(err)
		}
		if err := db.AutoMigrate(&Report{}); err != nil {
			panic(err)
		}
		locker := pglease.NewLocker(leases, pglease.WithTable("example_gorm"))
		lease, err := locker.Claim(ctx, "daily-report")
		if err != nil {
			panic(err)
		}

		err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
			if err := tx.Save(&Report{Day: "2024-01-31", Total: 42}).Error; err != nil {
				return err
			}
			sqlTx, err := sqlTxOf(tx)
			if err != nil {
				return err
			}
			return lease.GuardSQL(ctx, sqlTx) // last: an error rolls the transaction back
		})
		switch {
		case errors.Is(err, pglease.ErrLost):
			fmt.Println("lease lost: nothing was written")
		case err != nil:
			panic(err)
		default:
			fmt.Printf("PrepareStmt %v: written under fence > 0: %v\n", prepare, lease.Fence() > 0)
		}
		_ = locker.Close(ctx)
		_ = sqlDB.Close()
	}
	// Output:
	// PrepareStmt false: written under fence > 0: true
	// PrepareStmt true: written under fence > 0: true
}

// sqlx: a *sqlx.Tx embeds the *sql.Tx that GuardSQL takes (tx.Tx).
func Example_sqlx() {
	ctx := context.Background()
	db, err := sqlx.Open("pgx", databaseURL())
	if err != nil {
		panic(err)
	}
	defer db.Close()
	db.SetMaxOpenConns(8)
	leases := pglease.SQL(db.DB)
	if err := pglease.Migrate(ctx, leases, pglease.WithTable("example_sqlx")); err != nil {
		panic(err)
	}
	db.MustExecContext(ctx, `CREATE TABLE IF NOT EXISTS example_sqlx_report (day date PRIMARY KEY, total bigint NOT NULL)`)
	locker := pglease.NewLocker(leases, pglease.WithTable("example_sqlx"))
	defer locker.Close(ctx)
	lease, err := locker.Claim(ctx, "daily-report")
	if err != nil {
		panic(err)
	}

	err = func() error {
		tx, err := db.BeginTxx(ctx, nil)
		if err != nil {
			return err
		}
		defer func() { _ = tx.Rollback() }() // a no-op once committed
		if _, err := tx.NamedExecContext(ctx, `INSERT INTO example_sqlx_report VALUES (:day, :total)
			ON CONFLICT (day) DO UPDATE SET total = EXCLUDED.total`, map[string]any{"day": "2024-01-31", "total": 42}); err != nil {
			return err
		}
		if err := lease.GuardSQL(ctx, tx.Tx); err != nil {
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
		fmt.Println("written under fence > 0:", lease.Fence() > 0)
	}
	// Output: written under fence > 0: true
}
