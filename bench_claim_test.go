package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

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

// syncLosersClaimSQL is the claim statement before a claim committed
// asynchronously unless it took a row: a losing claim only read, but one
// that met the row while it changed hands (its snapshot saw it free, the
// conflict arm locked it, then found the winner's live lease) committed that
// lock synchronously, waiting for a WAL flush with the row locked.
const syncLosersClaimSQL = `INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at)
SELECT c.key, h.holder, clock.t, clock.t + make_interval(secs => $3)
  FROM (SELECT clock_timestamp() AS t) AS clock, (SELECT $1::text AS key) AS c, (SELECT $2::text AS holder) AS h
 WHERE NOT EXISTS (SELECT 1 FROM {table} AS cur
                   WHERE cur.key = c.key AND cur.expires_at > clock.t
                     AND cur.holder <> h.holder COLLATE "C")
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = GREATEST(lease.expires_at, EXCLUDED.expires_at),
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder COLLATE "C" OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid,
          set_config('synchronous_commit',
            CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
                 ELSE current_setting('synchronous_commit') END, true) AS durable`

// BenchmarkContendedKey has 8 replicas (holders) retry one key on a durable
// server, each claiming and, when it wins, releasing at once: job runs per
// second (runs/s), WAL flushes and transaction ids per job run, with the
// statements sent raw (now: today's claim; sync-losers: the claim whose
// losers that locked the row committed synchronously; locking: the claim
// whose every loser locked the row) and through Lockers, one per replica
// (locker), each on its own table of one server, in one run. A claim that
// locked the row it lost holds it until its commit, and the holder's
// release, which skips locked rows, is sent again meanwhile.
func BenchmarkContendedKey(b *testing.B) {
	const replicas = 8
	srv := durableServer(b)
	stats := statsConn(b, srv)
	for _, v := range []struct{ name, claim string }{
		{"now", sqlstmt.Claim}, {"sync-losers", syncLosersClaimSQL}, {"locking", lockingClaimSQL},
	} {
		b.Run(v.name, func(b *testing.B) {
			pool := benchPool(b, srv.DSN(), replicas+2, nil)
			table := benchTable(b, pool, "contended")
			claim, release := renderSQL(v.claim, table), renderSQL(benchReleaseSQL, table)
			var starved atomic.Int64
			contend(b, stats, replicas, func(ctx context.Context, r int) (bool, error) {
				holder := fmt.Sprintf("replica-%d", r)
				// A TTL of 1s: a release that gives up costs the key a
				// second, not the whole run.
				fence, won, err := claimRaw(ctx, pool, claim, "job", holder, 1, true)
				if err != nil || !won {
					return false, err
				}
				err = releaseRaw(ctx, pool, release, holder, "job", fence)
				if errors.Is(err, errStarved) {
					starved.Add(1)
					err = nil
				}
				return true, err
			})
			b.ReportMetric(float64(starved.Load()), "starved-releases")
		})
	}
	b.Run("locker", func(b *testing.B) {
		pool := benchPool(b, srv.DSN(), 2*replicas+2, nil)
		table := benchTable(b, pool, "contended")
		cycles := make([]cycle, replicas)
		for r := range cycles {
			cycles[r] = lockerCycle(benchLocker(b, pool, table, fmt.Sprintf("replica-%d", r)))
		}
		contend(b, stats, replicas, func(ctx context.Context, r int) (bool, error) { return cycles[r](ctx, "job") })
	})
}

// contend runs b.N attempts spread over replicas goroutines, attempt(r)
// being one claim of replica r and its release when it won, and reports job
// runs per second (runs/s), the share of attempts that won (won/op), and
// the server's WAL flushes (walsyncs/run) and transaction ids (xids/run) per
// job run, read from stats.
func contend(b *testing.B, stats *pgx.Conn, replicas int, attempt func(ctx context.Context, r int) (bool, error)) {
	b.Helper()
	ctx := context.Background()
	var (
		attempts, runs atomic.Int64
		wg             sync.WaitGroup
		failed         = make(chan error, replicas)
	)
	syncs, xids := walSyncs(b, stats), nextXID(b, stats)
	b.ResetTimer()
	start := time.Now()
	for r := range replicas {
		wg.Go(func() {
			for attempts.Add(1) <= int64(b.N) {
				won, err := attempt(ctx, r)
				if won {
					runs.Add(1)
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
	n := float64(max(runs.Load(), 1))
	b.ReportMetric(float64(runs.Load())/elapsed.Seconds(), "runs/s")
	b.ReportMetric(float64(runs.Load())/float64(b.N), "won/op")
	b.ReportMetric(float64(walSyncs(b, stats)-syncs)/n, "walsyncs/run")
	b.ReportMetric(float64(nextXID(b, stats)-xids)/n, "xids/run")
}

// nextXID is the server's next transaction id, read without taking one.
func nextXID(b *testing.B, conn *pgx.Conn) int64 {
	b.Helper()
	var n int64
	err := conn.QueryRow(context.Background(), "SELECT txid_snapshot_xmax(txid_current_snapshot())").Scan(&n)
	require.NoError(b, err)
	return n
}
