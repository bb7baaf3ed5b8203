package sqlstmt

// extendMine extends the rows of the CTE mine (key, ttl) that are still
// live, each by its own TTL, never moving an expiry back, and raises
// synchronous_commit: the heart of both heartbeat statements, which differ
// only in what they match rows on and report.
const extendMine = `UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp() + make_interval(secs => mine.ttl), l.expires_at)
    FROM mine
   WHERE l.key = mine.key
     AND l.expires_at > clock_timestamp()
     AND ` + raiseSessionSyncCommit + ` IS NOT NULL`

// reportedExpiry is the expiry a heartbeat statement reports for a row it
// extended: the row's own, or, for a row pinned with expires_at =
// 'infinity' (the CHECK allows it: an operator keeping a key), the latest
// instant a finite timestamptz holds. The driver cannot read infinity into
// a time, so reporting it would fail the whole round, and a Locker with
// one pinned row would lose every lease at its trust deadline. The row
// itself keeps its infinite expiry; the report says only "far away".
const reportedExpiry = `LEAST(l.expires_at, '294276-12-31 23:59:59.999999+00'::timestamptz)`

// Heartbeat extends every lease of the Locker in one statement per round,
// whatever their number, and reports on each lease: extended (with its new
// expiry), skipped because its row is locked, or lost.
//
//   - Each lease is extended by its own TTL ($2, one per key, beside the
//     keys and fences): leases of jobs with their own TTL (Locker.Job) share
//     the round, and one statement still serves them all.
//   - The guard (holder, fence, not expired) extends only the very mandate
//     the Locker holds: a row re-claimed by anyone, the same holder included,
//     has another fence, and a lapsed row is not revived. COLLATE "C":
//     holders are compared byte for byte, whatever the column's collation.
//   - FOR NO KEY UPDATE SKIP LOCKED, the lock the UPDATE takes anyway (a
//     foreign key check's FOR KEY SHARE does not conflict with it): a row
//     locked by another transaction (an operator's open transaction, a
//     guarded job's, another replica's claim in flight) is skipped, not
//     waited for. A plain UPDATE would wait on it, and one row
//     locked past the trust window would cost every lease of the Locker.
//   - A skipped row is told from a lost one without waiting: its last
//     committed version (the statement's snapshot, read without a lock)
//     still matches the guard. It comes back with a NULL expiry; such a
//     lease is retried, and is lost only at its own trust deadline. A lease
//     missing from the result is lost: its row provably no longer matches
//     (re-claimed or lapsed), and it never comes back. Both answers come
//     from the same statement, so a round stays one statement and one round
//     trip even when rows are locked.
//   - The skipped rows are looked for only when fewer rows were extended
//     than asked (a one-time filter): in the usual round, every row is
//     extended and that half of the statement costs nothing.
//   - The shape survives a generic plan, whose guess for unnest is far from
//     the real count: extended rows come back by a UNION ALL and are left
//     out of the skipped ones by NOT IN (a hashed subplan), never joined
//     against a CTE estimated at one row, which a nested loop would make
//     quadratic in the number of leases.
//   - An extended row reports its expiry as reportedExpiry: a row pinned
//     at 'infinity' is extended as the others (it keeps its expiry), and
//     costs no other lease the round.
//   - GREATEST(..., l.expires_at): a heartbeat never moves an expiry back.
//     After the server's clock steps back, clock_timestamp() + its TTL can fall
//     at or before acquired_at; the row as stored satisfies the CHECK
//     (expires_at > acquired_at), so an expiry never below it does too, and
//     no row can make the round fail (SQLSTATE 23514) for the others.
//   - set_config raises synchronous_commit to on for this transaction when
//     the session, role or database default is off or local, and keeps a
//     stronger setting (remote_write, on, remote_apply). The setting is read
//     at commit: an extension acknowledged before its WAL is flushed could
//     vanish in a crash while the holder keeps trusting it for a full TTL.
//   - clock_timestamp(), not now(): the server's time when the row is
//     updated, not when the transaction started. Each row also reports the
//     server's clock as the statement ran: a time read within the round
//     trip, for the Locker's clock-skew reading. The new expiry less the
//     TTL is not one: GREATEST keeps an expiry that is later (an operator
//     extended the row, the server's clock stepped back).
const Heartbeat = `WITH h AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[]) AS h(key, fence, ttl)
), mine AS (
  SELECT l.key, h.ttl FROM {table} AS l JOIN h ON l.key = h.key AND l.fence = h.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), extended AS (
  ` + extendMine + `
  RETURNING l.key, l.fence, ` + reportedExpiry + ` AS expires_at, clock_timestamp() AS now
)
SELECT key, fence, expires_at, now FROM extended
UNION ALL
SELECT c.key, c.fence, NULL, clock_timestamp()
  FROM h JOIN {table} AS c ON c.key = h.key AND c.fence = h.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($3::text[])`

// UnfencedHeartbeat is Heartbeat matching each row on its forged
// holder: it skips locked rows, never moves an expiry back, reports a
// pinned row's expiry as reportedExpiry and commits synchronously, for the
// same reasons, and extends each lease by its own
// TTL ($1, one per key). It does not read acquired_at, which the table may
// lack.
const UnfencedHeartbeat = `WITH h AS (
  SELECT * FROM unnest($2::text[], $3::text[], $1::float8[]) AS h(key, holder, ttl)
), mine AS (
  SELECT l.key, h.ttl FROM {table} AS l JOIN h ON l.key = h.key AND l.holder = h.holder COLLATE "C"
   WHERE l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), extended AS (
  ` + extendMine + `
  RETURNING l.key, l.holder, ` + reportedExpiry + ` AS expires_at, clock_timestamp() AS now
)
SELECT key, holder, expires_at, now FROM extended
UNION ALL
SELECT c.key, c.holder, NULL, clock_timestamp()
  FROM h JOIN {table} AS c ON c.key = h.key AND c.holder = h.holder COLLATE "C"
 WHERE c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($2::text[])`
