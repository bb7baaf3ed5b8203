package driver_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/driver/drivertest"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestFencedObeysTheContract runs the contract on PostgreSQL, the fake's
// reference (internal/driver/fakedriver/contract_test.go runs the same on
// the fake). Time passes for real here: the leases the cases let expire
// last a few hundred milliseconds.
func TestFencedObeysTheContract(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Harness{
		New: func(t *testing.T) drivertest.Table {
			t.Helper()
			_, pool, name := pgtest.Setup(t)
			return pgTable{tb: t, pool: pool, name: name}
		},
		Short: 300 * time.Millisecond,
	})
}

// pgTable is a lease table made by Migrate on the tests' server.
type pgTable struct {
	tb   testing.TB
	pool *pgxpool.Pool
	name string
}

func (p pgTable) DB() driver.DB { return p.pool }

// Protocol renders the statements for the table as a Locker does.
func (p pgTable) Protocol(holder string) driver.Protocol {
	return driver.Fenced(func(tmpl string) string { return sqlstmt.Render(tmpl, pgx.Identifier{p.name}) }, holder, time.Hour)
}

// Advance waits d, and a little more: the server's clock runs on the wall
// clock, which a time service may slew against the monotonic one Sleep
// counts on.
func (pgTable) Advance(d time.Duration) { time.Sleep(d + 5*time.Millisecond) }

func (p pgTable) Row(key string) (drivertest.Row, bool) {
	r, ok := pgtest.ReadRow(p.tb, p.pool, p.name, key)
	return drivertest.Row{Holder: r.Holder, Fence: r.Fence, Live: r.Live}, ok
}

func (p pgTable) LockRow(key string) func() {
	end := pgtest.LockRow(p.tb, p.pool, p.name, key)
	return func() { end(false) }
}
