package pglease

import (
	"database/sql"

	"github.com/pglease/pglease/internal/driver"
)

// SQL returns a DB on db, a database/sql pool of PostgreSQL connections
// opened with pgx's stdlib driver ("pgx") or lib/pq ("postgres"), for every
// entry point that takes a DB (New, NewLocker, Migrate, NewAdmin, ...):
//
//	locker, err := pglease.New(pglease.SQL(db), pglease.WithTable("leases"))
//
// A Locker treats it as it treats a *pgxpool.Pool: each statement takes a
// connection of its own from db, claims hold all but one of
// db.SetMaxOpenConns as it is when each claim runs (the heartbeat is never
// queued behind a claim waiting on a row lock; a pool without a limit
// opens one for it; New refuses a limit of one, and a limit lowered to one
// later leaves the heartbeat behind claims again), and a claim whose
// caller gives up is cancelled on the server and its answer read. (lib/pq
// sends that cancel request itself, once: pglease gives it each statement
// with its arguments written in its text, which lib/pq sends in one
// message that the request reaches while it runs; with arguments apart,
// lib/pq would send a parse and an execute in two round trips, and a
// request reaching the connection idle between them would be ignored.
// When database/sql drops the answer because the context ended, the
// claim's outcome is unknown and the Locker gives the row back, as after a
// lost reply; so does a statement that failed with driver.ErrBadConn,
// which lib/pq also reports for a reply cut
// off after the server ran it.) WithKeptConnection does not apply to it.
// The Locker polls for released keys rather than LISTEN (ClaimWait),
// unless WithListenDSN gives it a connection of its own for that. Guard a
// *sql.Tx with Lease.GuardSQL.
//
// The server's errors read as *pgconn.PgError whatever the driver (lib/pq's
// *pq.Error stays in the chain), and array arguments reach lib/pq, which
// takes no Go slices, as array literals. Begin returns a pgx.Tx that
// serves Exec, Query, QueryRow, Commit and Rollback; its other methods
// return an error saying why. SQL(nil) is a nil DB, which New refuses.
func SQL(db *sql.DB) DB {
	if db == nil {
		return nil
	}
	return driver.NewSQLDB(db)
}

var _ DB = (*driver.SQLDB)(nil)
