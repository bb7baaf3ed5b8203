package pglease_test

import (
	"fmt"
	"testing"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// oneTTLHeartbeatSQL is the heartbeat statement before leases had a TTL
// each (jobs with their own, Locker.Job): one TTL for the whole round, in
// seconds ($2). The baseline of BenchmarkHeartbeatTTLPerLease, kept as it
// was.
const oneTTLHeartbeatSQL = `WITH h AS (
  SELECT * FROM unnest($3::text[], $4::bigint[]) AS h(key, fence)
), mine AS (
  SELECT l.key FROM {table} AS l JOIN h ON l.key = h.key AND l.fence = h.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), extended AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp() + make_interval(secs => $2), l.expires_at)
    FROM mine
   WHERE l.key = mine.key
     AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit',
         CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
              ELSE current_setting('synchronous_commit') END, true) IS NOT NULL
  RETURNING l.key, l.fence, l.expires_at
)
SELECT key, fence, expires_at FROM extended
UNION ALL
SELECT c.key, c.fence, NULL
  FROM h JOIN {table} AS c ON c.key = h.key AND c.fence = h.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($3::text[])`

// BenchmarkHeartbeatTTLPerLease measures what a TTL per lease (Locker.Job)
// costs a heartbeat round: the round that takes each lease's TTL as an
// array beside the keys and fences ("per-lease", half the leases at 60s,
// half at 10s, as two jobs would have), against the round before, one TTL
// for all ("one-ttl"), alternating round by round in one run on a durable
// private server, on the same 1,000 leases. The ratio per-lease/one-ttl is
// what to read.
func BenchmarkHeartbeatTTLPerLease(b *testing.B) {
	srv := durableServer(b)

	for _, n := range []int{10, 1000} {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			pool := hardeningPool(b, srv.DSN(), "on")
			table := benchTable(b, pool, "jobttl")
			keys, fences := seedLeases(b, pool, table, "replica", n)
			ttls := each(n, benchTTL.Seconds())
			for i := 0; i < n; i += 2 {
				ttls[i] = 10
			}
			round := func(sql string, ttl any) cycle { return roundCycle(pool, sql, table, "replica", ttl, keys, fences) }
			runInterleaved(b, variant{"per-lease", []cycle{round(sqlstmt.Heartbeat, ttls)}},
				variant{"one-ttl", []cycle{round(oneTTLHeartbeatSQL, benchTTL.Seconds())}}, []string{"round"})
		})
	}
}
