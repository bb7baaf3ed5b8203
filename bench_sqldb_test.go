package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// BenchmarkSQLClaimRelease is a job run (Claim, then Unlock) through a
// Locker on database/sql (SQL) with each driver, on the loopback and over
// a link with 1 ms of latency each way: lib/pq's statements go in one
// message, their arguments in their text, where a statement with
// arguments apart costs lib/pq two round trips.
func BenchmarkSQLClaimRelease(b *testing.B) {
	for _, link := range []time.Duration{0, time.Millisecond} {
		for _, driver := range []string{"pgx", "pq"} {
			b.Run("latency="+link.String()+"/"+driver, func(b *testing.B) {
				p := pgtest.Proxy(b, "")
				p.SetLatency(link, 0, 1)
				pool := pgtest.PoolWith(b, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
					cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Host(), p.Port()
					cfg.MaxConns = 4
				})
				table := benchTable(b, pool, "sqlclaim")
				c := lockerCycle(benchLocker(b, pglease.SQL(pgtest.OpenSQL(b, pool, driver)), table, "replica"))
				ctx := context.Background()
				if _, err := c(ctx, "job"); err != nil {
					b.Fatal(err)
				}
				b.ReportAllocs()
				b.ResetTimer()
				for range b.N {
					if _, err := c(ctx, "job"); err != nil {
						b.Fatal(err)
					}
				}
			})
		}
	}
}
