package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgtest"
)

// BenchmarkGuardedCommit measures what Guard adds to a job's transaction:
// the same small transaction (BEGIN, one INSERT into a ledger, COMMIT) with
// and without Guard before the commit, interleaved op by op in one run on
// one pool, so that both sides see the same server and load. Guard is one
// more statement, hence one more round trip; the ratio guarded/plain is the
// figure (docs/BENCHMARKS.md). The shared test server runs with fsync off,
// which makes the commit cheap and the ratio an upper bound.
func BenchmarkGuardedCommit(b *testing.B) {
	ctx := context.Background()
	pool := benchPool(b, pgtest.Server.DSN(), 4, nil)
	table := benchTable(b, pool, "guard")
	ledger := pgtest.NewLedger(b, pool)
	l := benchLocker(b, pool, table, "bench")
	lease, err := l.Claim(ctx, "job")
	require.NoError(b, err)

	run := func(guard bool) error {
		return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
			if err := writeLedger(ctx, tx, ledger, lease); err != nil {
				return err
			}
			if guard {
				return lease.Guard(ctx, tx)
			}
			return nil
		})
	}
	for range 20 { // prepare both statements on the pool's connections
		require.NoError(b, run(true))
	}

	var spent [2]time.Duration
	var runs [2]int
	b.ResetTimer()
	for i := range b.N {
		side := i % 2 // 0 plain, 1 guarded
		start := time.Now()
		if err := run(side == 1); err != nil {
			b.Fatal(err)
		}
		spent[side] += time.Since(start)
		runs[side]++
	}
	b.StopTimer()
	var mean [2]float64
	for side := range spent {
		mean[side] = float64(spent[side]) / float64(max(runs[side], 1))
	}
	b.ReportMetric(mean[0], "plain-ns/tx")
	b.ReportMetric(mean[1], "guarded-ns/tx")
	if mean[0] > 0 {
		b.ReportMetric(mean[1]/mean[0], "guarded/plain")
	}
}
