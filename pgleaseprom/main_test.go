package pgleaseprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
)

// server is the one PostgreSQL every test of the package shares; tests
// isolate themselves with a table each.
var server *pgserver.Server

func TestMain(m *testing.M) {
	server = pgserver.ForTestMain(pgserver.Options{})
	os.Exit(server.AfterTests(m.Run()))
}

var tableSeq atomic.Int64

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// newPool connects to the shared server, closed at cleanup.
func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), server.DSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

// newTable returns a fresh, migrated table name for one test.
func newTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("leaseprom_t%d", tableSeq.Add(1))
	require.NoError(t, pglease.Migrate(context.Background(), pool, pglease.WithTable(name)))
	return name
}

// newLocker returns a quiet Locker on table, closed at cleanup.
func newLocker(t *testing.T, db pglease.DB, table, holder string, opts ...pglease.Option) *pglease.Locker {
	t.Helper()
	all := append([]pglease.Option{
		pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(slog.New(slog.DiscardHandler)),
	}, opts...)
	l := pglease.NewLocker(db, all...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// value reads one counter or gauge back from reg: the series of the family
// name whose labels are exactly labels. It fails the test if there is none.
func value(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) float64 {
	t.Helper()
	m := find(t, reg, name, labels)
	switch {
	case m.GetCounter() != nil:
		return m.GetCounter().GetValue()
	case m.GetGauge() != nil:
		return m.GetGauge().GetValue()
	}
	t.Fatalf("%s%v is neither a counter nor a gauge", name, labels)
	return 0
}

// histogram reads the sample count and sum of a histogram back from reg.
func histogram(t *testing.T, reg *prometheus.Registry, name string) (uint64, float64) {
	t.Helper()
	h := find(t, reg, name, nil).GetHistogram()
	require.NotNil(t, h, "%s is a histogram", name)
	return h.GetSampleCount(), h.GetSampleSum()
}

func find(t *testing.T, reg *prometheus.Registry, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		if f.GetName() != name {
			continue
		}
		for _, m := range f.GetMetric() {
			if sameLabels(m.GetLabel(), labels) {
				return m
			}
		}
	}
	t.Fatalf("no series %s%v in the registry", name, labels)
	return nil
}

func sameLabels(pairs []*dto.LabelPair, want map[string]string) bool {
	if len(pairs) != len(want) {
		return false
	}
	for _, p := range pairs {
		if v, ok := want[p.GetName()]; !ok || v != p.GetValue() {
			return false
		}
	}
	return true
}

// failingHeartbeats wraps a DB and fails pglease's heartbeat statement
// while fail is set, as a network outage would.
type failingHeartbeats struct {
	pglease.DB
	fail atomic.Bool
}

var errInjected = errors.New("injected heartbeat failure")

func (f *failingHeartbeats) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if f.fail.Load() && strings.Contains(sql, "unnest(") {
		return nil, errInjected
	}
	return f.DB.Query(ctx, sql, args...)
}
