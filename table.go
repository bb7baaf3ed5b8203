package pglease

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/pglease/pglease/internal/driver"
)

// tableRecheck is how long a check of the table that passed stands: a
// claim after that reads the catalogs again, so that a fence sequence set
// back or a table made UNLOGGED while Lockers run (a restore, a migration
// tool's down-and-up) is refused within it, not only by the next Locker.
// One catalog read every ten seconds per claiming Locker, none while it
// only heartbeats.
const tableRecheck = 10 * time.Second

// tableCheck is the read a Locker makes of its table before its claims
// (check): one read at a time, and none while one that passed stands.
type tableCheck struct {
	read   func(ctx context.Context) error // the catalogs' read (readTable)
	turn   chan struct{}                   // held by the read in flight
	passed atomic.Pointer[time.Time]       // when the last read that passed began; nil: none
	every  time.Duration                   // how long it stands: tableRecheck (tests change it)
}

func newTableCheck(read func(ctx context.Context) error) tableCheck {
	return tableCheck{read: read, turn: make(chan struct{}, 1), every: tableRecheck}
}

// fresh reports whether a check passed within every.
func (c *tableCheck) fresh() bool {
	at := c.passed.Load()
	return at != nil && time.Since(*at) < c.every
}

// check refuses a claim on a table whose fence sequence could hand out
// fences backwards, or whose key column's collation matches keys that
// differ in bytes (driver.CheckTable), before anything is written: a table
// made from schema.sql by a migration tool is used without Migrate's
// checks. It reads the catalogs at a Locker's first claim and again at the
// first claim after every; a read that failed or refused is made again at
// the next claim (after ALTER SEQUENCE, a claim goes through). Every lease,
// and so every Guard, comes from a claim that passed a check at most every
// old.
func (c *tableCheck) check(ctx context.Context) error {
	if c.fresh() {
		return nil
	}
	select {
	case c.turn <- struct{}{}:
	case <-ctx.Done():
		return fmt.Errorf("waiting for the check of the table: %w", context.Cause(ctx))
	}
	defer func() { <-c.turn }()
	if c.fresh() {
		return nil
	}
	began := time.Now()
	if err := c.read(ctx); err != nil {
		c.passed.Store(nil)
		return err
	}
	c.passed.Store(&began)
	return nil
}

// readTable is a Locker's read of its table t, for use, on db
// (driver.CheckTable). Under default_transaction_isolation = serializable,
// the read of the table's fences can meet claims of its rows: a 40001 is
// read again; so is a read cut by a session's statement_timeout shorter
// than a fresh backend's first read of these catalogs, once they are
// cached.
func readTable(ctx context.Context, db DB, t driver.Table, use driver.TableUse) error {
	read := func() error {
		return driver.RetrySerialization(ctx, func() error { return driver.CheckTable(ctx, db, t, use) })
	}
	err := read()
	for range 4 {
		if !driver.StatementTimedOut(ctx, err) {
			break
		}
		err = read()
	}
	if err != nil {
		return fmt.Errorf("table %s: %w", t, err)
	}
	return nil
}
