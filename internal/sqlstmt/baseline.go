package sqlstmt

// The statements below are not pglease's: they are what the benchmarks (of
// the root package and of the bench program) compare pglease's statements
// against, or use to set a table up, written once for both.

// BaselinePerLeaseHeartbeat extends one lease, with the same guard as the
// batched Heartbeat: what a heartbeat without arrays would send once per
// lease. Its arguments are the holder, the TTL in seconds, the key and the
// fence.
const BaselinePerLeaseHeartbeat = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
 WHERE l.key = $3 AND l.holder = $1 AND l.fence = $4
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`

// SeedLeases creates n ($2) live leases of one holder ($1) in one
// statement, for the heartbeat benchmarks that need many rows but not many
// claims. It returns each lease's key and fence.
const SeedLeases = `INSERT INTO {table} (key, holder, expires_at)
SELECT 'k' || g, $1, clock_timestamp() + interval '1 hour' FROM generate_series(1, $2::int) AS g
RETURNING key, fence`
