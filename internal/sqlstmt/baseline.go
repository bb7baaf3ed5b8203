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

// The claim and the release before the hardening, kept as they were: what
// the common path is measured against (BenchmarkHardeningCost, and the
// bench program's common-path study).
const (
	// BaselineUnhardenedClaim locked the row of another holder's live lease
	// before judging it, so that a losing claim got a transaction id and,
	// committing synchronously, waited for a WAL flush with the row locked;
	// it committed as the session's synchronous_commit said, and read the
	// clock more than once. Its arguments are the key, the holder and the TTL
	// in seconds.
	BaselineUnhardenedClaim = `INSERT INTO {table} AS lease (key, holder, expires_at)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = EXCLUDED.expires_at,
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live`

	// BaselineUnhardenedRelease was a plain UPDATE of one row that waited
	// on its lock however long it was held. Its arguments are the key, the
	// holder, the fence and the min hold in seconds.
	BaselineUnhardenedRelease = `UPDATE {table}
   SET expires_at = GREATEST(clock_timestamp(), acquired_at + make_interval(secs => $4))
 WHERE key = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL`
)
