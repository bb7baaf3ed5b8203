package fakedriver_test

import (
	"testing"
	"time"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/driver/drivertest"
	"github.com/pglease/pglease/internal/driver/fakedriver"
)

// TestFakeObeysTheContract holds the fake to the contract the real driver
// obeys on PostgreSQL (internal/driver/fenced_test.go runs the same).
func TestFakeObeysTheContract(t *testing.T) {
	t.Parallel()
	drivertest.Run(t, drivertest.Harness{
		New:   func(*testing.T) drivertest.Table { return contractTable{fakedriver.NewTable()} },
		Short: 5 * time.Second,
	})
}

// contractTable is a fake table as the contract reads it.
type contractTable struct{ *fakedriver.Table }

func (contractTable) DB() driver.DB { return nil }

func (c contractTable) Protocol(holder string) driver.Protocol { return c.Table.Protocol(holder) }

func (c contractTable) LockRow(key string) func() { return c.Lock(key) }

func (c contractTable) Row(key string) (drivertest.Row, bool) {
	r, ok := c.Table.Row(key)
	return drivertest.Row{Holder: r.Holder, Fence: r.Fence, Live: r.Live}, ok
}
