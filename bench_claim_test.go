package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// lockingClaimSQL is the claim statement before a losing claim only read:
// its conflict arm locked the row of another holder's live lease before
// judging it, so that a losing claim got a transaction id, wrote a lock
// record and a commit record, and waited for the WAL flush at its commit.
const lockingClaimSQL = `INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at)
SELECT $1, $2, clock.t, clock.t + make_interval(secs => $3)
  FROM (SELECT clock_timestamp() AS t) AS clock
 WHERE set_config('synchronous_commit',
         CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
              ELSE current_setting('synchronous_commit') END, true) IS NOT NULL
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = EXCLUDED.expires_at,
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder COLLATE "C" OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid`

// BenchmarkContendedKey has 8 replicas (holders) retry one key on a durable
// server, each claiming and, when it wins, releasing at once: job runs per
// second (runs/s) with today's claim statement (now) and with the claim
// that locked the row it lost (locking), each on its own table of one
// server, in one run. A losing claim of the locking form waits for a WAL
// flush and holds the row locked meanwhile, so the holder's release, which
// skips locked rows, finds it locked again and again.
func BenchmarkContendedKey(b *testing.B) {
	srv := durableServer(b)
	for _, v := range []struct{ name, claim string }{{"now", sqlstmt.Claim}, {"locking", lockingClaimSQL}} {
		b.Run(v.name, func(b *testing.B) {
			const replicas = 8
			pool := benchPool(b, srv.DSN(), replicas+2, nil)
			table := benchTable(b, pool, "contended")
			cycles := make([]cycle, replicas)
			for r := range cycles {
				cycles[r] = claimCycle(pool, table, fmt.Sprintf("replica-%d", r), v.claim)
			}
			ctx := context.Background()
			var (
				attempts, runs atomic.Int64
				wg             sync.WaitGroup
				failed         = make(chan error, replicas)
			)
			b.ResetTimer()
			start := time.Now()
			for r := range replicas {
				wg.Go(func() {
					for attempts.Add(1) <= int64(b.N) {
						won, err := cycles[r](ctx, "job")
						if err != nil {
							failed <- err
							return
						}
						if won {
							runs.Add(1)
						}
					}
				})
			}
			wg.Wait()
			elapsed := time.Since(start)
			b.StopTimer()
			close(failed)
			if err := <-failed; err != nil {
				b.Fatal(err)
			}
			b.ReportMetric(float64(runs.Load())/elapsed.Seconds(), "runs/s")
			b.ReportMetric(float64(runs.Load())/float64(b.N), "won/op")
		})
	}
}
