package pglease_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/rawsql"
)

// BenchmarkHeartbeatTTLPerLease measures what a TTL per lease (Locker.Job)
// costs a heartbeat round: the round that takes each lease's TTL as an
// array beside the keys and fences ("per-lease", half the leases at 60s,
// half at 10s, as two jobs would have), against the round before, one TTL
// for all ("one-ttl"), alternating round by round in one run on a durable
// private server, on the same 1,000 leases. The ratio per-lease/one-ttl is
// what to read.
func BenchmarkHeartbeatTTLPerLease(b *testing.B) {
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Durable: true, Private: true})
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })

	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			pool := hardeningPool(b, srv.DSN(), "on")
			table := benchTable(b, pool, "jobttl")
			keys, fences := seedLeases(b, pool, table, "replica", n)
			ttls := rawsql.Each(n, benchTTL.Seconds())
			for i := 0; i < n; i += 2 {
				ttls[i] = 10
			}
			round := func(sql string, ttl any) cycle {
				sql = renderSQL(sql, table)
				return func(ctx context.Context, _ string) (bool, error) {
					rows, err := pool.Query(ctx, sql, "replica", ttl, keys, fences)
					if err != nil {
						return false, err
					}
					extended := 0
					for rows.Next() {
						extended++
					}
					if err := rows.Err(); err != nil {
						return false, err
					}
					if extended != n {
						return false, fmt.Errorf("a round extended %d of %d leases", extended, n)
					}
					return true, nil
				}
			}
			runInterleaved(b, variant{"per-lease", []cycle{round(rawsql.Heartbeat, ttls)}},
				variant{"one-ttl", []cycle{round(rawsql.OneTTLHeartbeat, benchTTL.Seconds())}}, []string{"round"})
		})
	}
}
