package pglease

import (
	"database/sql"

	"github.com/pglease/pglease/internal/driver"
)

// SQL returns a DB on db, a database/sql pool opened with pgx's stdlib driver
// ("pgx") or lib/pq ("postgres"), for NewLocker, Migrate and NewAdmin:
//
//	locker := pglease.NewLocker(pglease.SQL(db), pglease.WithTable("leases"))
//
// A Locker uses it as it uses a *pgxpool.Pool: claims leave one connection of
// db.SetMaxOpenConns to the heartbeat (NewLocker refuses a limit of one), and
// a claim given up is cancelled on the server. Waiting claims poll unless
// WithListenDSN is given; WithKeptConnection does not apply. Server errors
// read as *pgconn.PgError with either driver. Guard a *sql.Tx with
// Lease.GuardSQL. SQL(nil) is a nil DB. See docs/GUIDE.md, "SQL".
func SQL(db *sql.DB) DB {
	if db == nil {
		return nil
	}
	return driver.NewSQLDB(db)
}

var _ DB = (*driver.SQLDB)(nil)
