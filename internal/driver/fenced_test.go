package driver_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
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

// TestFencedClaimRow checks that a claim sent on the Locker's connections
// returns exactly the row's lease as pgx's own Scan reads it on the same
// pool: decoded in place on pgx's default types, and through that Scan on
// a pool that scans times in UTC and on one that speaks the simple
// protocol (text), as a pooler asks.
func TestFencedClaimRow(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name      string
		configure func(*pgxpool.Config)
	}{
		{"pgx's default types", nil},
		{"times scanned in UTC", func(cfg *pgxpool.Config) {
			cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
				conn.TypeMap().RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID, Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
				return nil
			}
		}},
		{"times wrapped to UTC by a scan wrapper", func(cfg *pgxpool.Config) {
			cfg.AfterConnect = func(_ context.Context, conn *pgx.Conn) error {
				m := conn.TypeMap()
				m.TryWrapScanPlanFuncs = append([]pgtype.TryWrapScanPlanFunc{utcTimes}, m.TryWrapScanPlanFuncs...)
				return nil
			}
		}},
		{"the simple protocol", func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, _, name := pgtest.Setup(t)
			pool := pgtest.PoolWith(t, pgtest.Server.DSN(), tc.configure)
			conns := driver.NewConns(pool, false)
			t.Cleanup(conns.Close)
			p := pgTable{tb: t, pool: pool, name: name}.Protocol("scanner")
			c, ok, err := p.Claim(ctx, conns.Claim(), "k", time.Minute, 0)
			if err != nil || !ok {
				t.Fatalf("claim: %v, took it: %v", err, ok)
			}
			var want driver.Claimed
			err = pool.QueryRow(ctx, fmt.Sprintf("SELECT holder, fence, acquired_at, expires_at, true, tableoid FROM %s WHERE key = 'k'",
				pgx.Identifier{name}.Sanitize())).Scan(&want.Holder, &want.Fence, &want.AcquiredAt, &want.ExpiresAt, &want.Live, &want.Table)
			if err != nil {
				t.Fatal(err)
			}
			if c != want {
				t.Errorf("the claim returned %+v, the row read by pgx is %+v", c, want)
			}
			if strings.Contains(tc.name, "UTC") && (c.AcquiredAt.Location() != time.UTC || c.ExpiresAt.Location() != time.UTC) {
				t.Errorf("a claim on a pool that scans times in UTC returned its time in %v", c.AcquiredAt.Location())
			}
		})
	}
}

// utcTimes is a scan wrapper an application may put first in its type
// map: every *time.Time is scanned in UTC.
func utcTimes(target any) (pgtype.WrappedScanPlanNextSetter, any, bool) {
	t, ok := target.(*time.Time)
	if !ok {
		return nil, nil, false
	}
	return &utcPlan{}, (*utcTime)(t), true
}

type utcTime time.Time

func (u *utcTime) ScanTimestamptz(v pgtype.Timestamptz) error {
	*u = utcTime(v.Time.UTC())
	return nil
}

// utcPlan hands the next plan the wrapped target.
type utcPlan struct{ next pgtype.ScanPlan }

func (p *utcPlan) SetNext(next pgtype.ScanPlan) { p.next = next }

func (p *utcPlan) Scan(src []byte, target any) error {
	return p.next.Scan(src, (*utcTime)(target.(*time.Time)))
}
