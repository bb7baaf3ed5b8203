// Package drivertest is the contract of the fenced protocol
// (driver.Protocol as driver.Fenced speaks it), as one test that any
// implementation runs: the real driver on PostgreSQL and the in-memory
// fake of internal/driver/fakedriver run it alike, so that what a test of
// the logic above the driver shows on the fake holds on the server.
//
// Each case asserts something an implementation could get wrong, on a
// fresh table, with two holders ("a" and "b": two Protocol values on the
// same table), and lets server time pass only through Table.Advance.
package drivertest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

// Harness is what Run needs of an implementation.
type Harness struct {
	// New is a fresh, empty lease table for t, with its fence sequence and
	// its ledger of runs.
	New func(t *testing.T) Table
	// Short is a TTL and a min hold that the cases let pass
	// (Table.Advance) to see a lease end: a few hundred milliseconds where
	// Advance sleeps. At most a tenth of an hour, the TTL of the leases
	// that must outlive a case.
	Short time.Duration
}

// Table is one fresh lease table of a Harness.
type Table interface {
	// DB is what the Protocol's statements are sent on.
	DB() driver.DB
	// Protocol is the fenced protocol of holder on this table, of a
	// Locker whose own TTL is an hour: the TTL of the cases' long leases.
	Protocol(holder string) driver.Protocol
	// Advance lets at least d of server time pass: a fake moves its
	// clock, a real server is waited for.
	Advance(d time.Duration)
	// Row reads the row of key as stored, and whether there is one.
	Row(key string) (Row, bool)
	// LockRow takes the row lock of key's row in another transaction,
	// until the returned function ends it.
	LockRow(key string) (unlock func())
}

// Row is a lease row as stored.
type Row struct {
	Holder string
	Fence  int64
	Live   bool // its expiry is after the server's clock
}

// long is the TTL of the leases that must stay live for a whole case.
const long = time.Hour

// day is the period of the jobs of ticks whose tick must not change
// during a case (on a real server's clock, it changes at noon UTC).
const day = 24 * time.Hour

// Run runs every case of the contract against h, each in a parallel
// subtest on a table of its own.
func Run(t *testing.T, h Harness) {
	t.Helper()
	require.Positive(t, h.Short)
	require.LessOrEqual(t, h.Short, long/10, "Short must leave the leases of TTL %v live through a case", long)
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			c.run(newCase(t, h))
		})
	}
}
