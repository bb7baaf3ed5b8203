// Package rawsql holds copies of pglease's statements, so that benchmarks
// and the bench program can send them raw through a pool as the baseline a
// Locker is measured against. The copies are checked against what a Locker
// really sends (TestBenchmarkBaselinesSendTheLockersExactStatements, and
// the bench program before it runs), so they cannot drift unnoticed.
package rawsql

import (
	"strings"

	"github.com/jackc/pgx/v5"
)

// raiseSyncCommit is raiseSyncCommitSQL of locker.go.
const raiseSyncCommit = `set_config('synchronous_commit',
         CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
              ELSE current_setting('synchronous_commit') END, true)`

// Claim is the claim statement of locker.go.
const Claim = `INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at)
SELECT $1, $2, clock.t, clock.t + make_interval(secs => $3)
  FROM (SELECT clock_timestamp() AS t) AS clock
 WHERE ` + raiseSyncCommit + ` IS NOT NULL
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = EXCLUDED.expires_at,
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder COLLATE "C" OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid`

// PrevClaim is the claim statement before claims were made durable
// whatever the server's default and took their times from one clock
// reading: the baseline that measures what that costs.
const PrevClaim = `INSERT INTO {table} AS lease (key, holder, expires_at)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = EXCLUDED.expires_at,
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live`

// Release is the release statement of release.go. Its arguments are the
// holder, the min hold of each lease in seconds (Each), the keys and their
// fences.
const Release = `WITH r AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[]) AS r(key, fence, min_hold)
), mine AS (
  SELECT l.key, r.min_hold FROM {table} AS l JOIN r ON l.key = r.key AND l.fence = r.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               l.acquired_at + make_interval(secs => mine.min_hold),
                               l.acquired_at + interval '1 microsecond')
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()` + releaseAsync + `
  RETURNING l.key, l.fence, pg_notify({chanlit}, l.key)
)
SELECT key, fence, true FROM released
UNION ALL
SELECT c.key, c.fence, false
  FROM r JOIN {table} AS c ON c.key = r.key AND c.fence = r.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM released)`

// releaseAsync is the clause that makes the release commit without
// waiting for the WAL flush.
const releaseAsync = `
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// PrevRelease is the release statement before releases skipped locked
// rows: a plain UPDATE of one row that waits on its lock. Its arguments are
// the key, the holder, the fence and the min hold in seconds.
const PrevRelease = `UPDATE {table}
   SET expires_at = GREATEST(clock_timestamp(), acquired_at + make_interval(secs => $4))
 WHERE key = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// NaiveRelease is Release without its set_config clause: it commits
// synchronously, waiting for the WAL flush like any statement.
var NaiveRelease = strings.Replace(Release, releaseAsync, "", 1)

// Heartbeat is the heartbeat statement of heartbeat.go. Its arguments are
// the holder, the TTL of each lease in seconds (Each), the keys and their
// fences.
const Heartbeat = `WITH h AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[]) AS h(key, fence, ttl)
), mine AS (
  SELECT l.key, h.ttl FROM {table} AS l JOIN h ON l.key = h.key AND l.fence = h.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), extended AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp() + make_interval(secs => mine.ttl), l.expires_at)
    FROM mine
   WHERE l.key = mine.key
     AND l.expires_at > clock_timestamp()
     AND ` + raiseSyncCommit + ` IS NOT NULL
  RETURNING l.key, l.fence, l.expires_at
)
SELECT key, fence, expires_at FROM extended
UNION ALL
SELECT c.key, c.fence, NULL
  FROM h JOIN {table} AS c ON c.key = h.key AND c.fence = h.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($3::text[])`

// OneTTLHeartbeat is Heartbeat before leases had a TTL each (jobs with
// their own, Locker.Job): one TTL for the whole round, in seconds ($2).
// The baseline that measures what the per-lease TTLs cost.
const OneTTLHeartbeat = `WITH h AS (
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
     AND ` + raiseSyncCommit + ` IS NOT NULL
  RETURNING l.key, l.fence, l.expires_at
)
SELECT key, fence, expires_at FROM extended
UNION ALL
SELECT c.key, c.fence, NULL
  FROM h JOIN {table} AS c ON c.key = h.key AND c.fence = h.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($3::text[])`

// Each is the array of n equal durations in seconds that Heartbeat and
// Release take, one per lease, when every lease has the same.
func Each(n int, seconds float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = seconds
	}
	return out
}

// PrevHeartbeat is the heartbeat statement before rounds skipped locked
// rows: one UPDATE that waits on every row it matches. The baseline that
// measures what skipping costs.
const PrevHeartbeat = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
  FROM unnest($3::text[], $4::bigint[]) AS h(key, fence)
 WHERE l.key = h.key AND l.holder = $1 AND l.fence = h.fence
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`

// Render fills a statement template for an unqualified table name the way
// pglease does, so that the raw baseline sends byte for byte the same text.
func Render(tmpl, table string) string {
	seq := pgx.Identifier{table + "_fence_seq"}.Sanitize()
	return strings.NewReplacer(
		"{table}", pgx.Identifier{table}.Sanitize(),
		"{seqlit}", "'"+strings.ReplaceAll(seq, "'", "''")+"'",
		// The channel of table.channel (notify.go), for the short names of
		// benchmark tables.
		"{chanlit}", "'"+strings.ReplaceAll("pglease:"+table, "'", "''")+"'",
	).Replace(tmpl)
}
