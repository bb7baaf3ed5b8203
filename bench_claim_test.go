package pglease_test

import (
	"context"
	"errors"
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
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid, '' AS durable`

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
			claim, release := renderSQL(v.claim, table), renderSQL(benchReleaseSQL, table)
			ctx := context.Background()
			var (
				attempts, runs, starved atomic.Int64
				wg                      sync.WaitGroup
				failed                  = make(chan error, replicas)
			)
			b.ResetTimer()
			start := time.Now()
			for r := range replicas {
				holder := fmt.Sprintf("replica-%d", r)
				wg.Go(func() {
					for attempts.Add(1) <= int64(b.N) {
						// A TTL of 1s: a release that gives up costs the
						// key a second, not the whole run.
						fence, won, err := claimRaw(ctx, pool, claim, "job", holder, 1, true)
						if err == nil && won {
							runs.Add(1)
							err = releaseRaw(ctx, pool, release, holder, "job", fence)
							if errors.Is(err, errStarved) {
								starved.Add(1)
								err = nil
							}
						}
						if err != nil {
							failed <- err
							return
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
			b.ReportMetric(float64(starved.Load()), "starved-releases")
			b.ReportMetric(float64(runs.Load())/elapsed.Seconds(), "runs/s")
			b.ReportMetric(float64(runs.Load())/float64(b.N), "won/op")
		})
	}
}
