package fakedriver

import (
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/driver"
)

// OID is the table's oid every claim reports (driver.Claimed.Table): one
// in-memory table is as good as another, and no Guard reads it here.
const OID uint32 = 16384

// Table is an in-memory lease table: its rows, the counter its fences are
// drawn from, its ledger of runs and its server clock. One mutex guards
// them all, so that each statement is atomic against every other, as one
// statement is on the server, and the Protocol values of several holders
// may share a table from any goroutine. The faults and gates of its
// Drivers (fault.go, gate.go) are behind the same mutex: there is no other
// lock, and so no lock order to keep.
type Table struct {
	mu    sync.Mutex
	now   time.Time // the server's clock (clock.go)
	rows  map[string]*row
	fence int64                    // the last fence drawn
	runs  map[runKey]string        // the ledger: each run's outcome, "" while open
	locks map[string]chan struct{} // rows locked by another transaction (lock.go), closed when it ends
}

// row is a lease row as stored. A zero tick or release time is the
// column's NULL: the zero time.Time is no instant a clock reads.
type row struct {
	holder   string
	fence    int64
	acquired time.Time
	expires  time.Time
	tick     time.Time // the tick of a job's schedule the row was claimed for
	released time.Time // when its holder released it; cleared by a claim
}

// runKey is the ledger's key: a run's fence and its tick.
type runKey struct {
	fence int64
	tick  int64 // in Unix microseconds
}

func keyOfRun(fence int64, tick time.Time) runKey {
	return runKey{fence: fence, tick: tick.UnixMicro()}
}

// NewTable is an empty table whose clock reads Start.
func NewTable() *Table {
	return &Table{now: Start, rows: map[string]*row{}, runs: map[runKey]string{}, locks: map[string]chan struct{}{}}
}

// Protocol is the fenced protocol of holder on the table.
func (t *Table) Protocol(holder string) *Driver {
	return &Driver{t: t, holder: holder}
}

// Row is a row of the table as stored, for a test to check.
type Row struct {
	Holder     string
	Fence      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Tick       time.Time // zero if the row carries none
	ReleasedAt time.Time // zero if its lease was not released
	Live       bool      // ExpiresAt is after the clock
}

// Row reads the row of key, and whether there is one.
func (t *Table) Row(key string) (Row, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	r, ok := t.rows[key]
	if !ok {
		return Row{}, false
	}
	return Row{
		Holder: r.holder, Fence: r.fence, AcquiredAt: r.acquired, ExpiresAt: r.expires,
		Tick: r.tick, ReleasedAt: r.released, Live: r.expires.After(t.clock()),
	}, true
}

// drawFence is the sequence's nextval: it is never given back, even by a
// statement that then fails.
func (t *Table) drawFence() int64 {
	t.fence++
	return t.fence
}

// checkRow is the table's CHECK (expires_at > acquired_at).
func checkRow(key string, r row) error {
	if r.expires.After(r.acquired) {
		return nil
	}
	return &pgconn.PgError{
		Severity: "ERROR",
		Code:     "23514",
		Message:  `new row for relation "lease" violates check constraint "lease_check"`,
		Detail:   "Failing row has key " + key + ".",
	}
}

// live reports whether r's lease is unexpired at now: expiry is
// expires_at <= now, as every statement judges it.
func (r *row) live(now time.Time) bool { return r.expires.After(now) }

// rowLease is what a row tells of its lease (driver.RowLease).
func (r *row) rowLease(now time.Time) driver.RowLease {
	return driver.RowLease{Holder: r.holder, Fence: r.fence, Live: r.live(now)}
}
