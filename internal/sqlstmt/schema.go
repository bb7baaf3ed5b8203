package sqlstmt

import "time"

// The statements of Migrate and Purge: the DDL of a lease table, the purge
// of old rows, and the checks Migrate makes of what it finds.

// CreateSequence makes the sequence that issues fences. A sequence, not
// fence + 1: the fence then grows on every claim of a key, re-entrant ones
// included, and does not restart at 1 when a purged key is claimed again.
//
// Its defaults (INCREMENT BY 1, CACHE 1, NO CYCLE, the bigint maximum) are
// what fences need; IF NOT EXISTS keeps an existing sequence as it is, which
// FenceSequence then checks.
const CreateSequence = `CREATE SEQUENCE IF NOT EXISTS {seq} AS bigint`

// CreateTable makes the lease table. One row per key, updated in place
// for its whole life. There is deliberately no index on expires_at: without
// it every claim, heartbeat and release is a HOT update and the table stays
// a few pages forever. The table stays LOGGED: a claim must survive a crash
// or fences could go backwards.
const CreateTable = `CREATE TABLE IF NOT EXISTS {table} (
    key         text        PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT nextval({seqlit}),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    tick        timestamptz,
    released_at timestamptz,
    CHECK (expires_at > acquired_at)
)`

// The columns a table made before them lacks: tick, the tick of a job's
// schedule the lease was claimed for (sqlstmt.ClaimTick), and released_at,
// when the lease's holder released it (the release statements set it, the
// claims clear it), which tells a lease released from one that lapsed.

// MissingColumns names the columns of AddColumns the table ($1, its quoted
// name) lacks, comma-separated; empty when it has them all, or when there
// is no such table (the statements then say so themselves).
const MissingColumns = missingColumns

const missingColumns = `SELECT coalesce(string_agg(c.name, ', ' ORDER BY c.name), '')
  FROM unnest(ARRAY['tick', 'released_at']) AS c(name)
 WHERE to_regclass($1) IS NOT NULL AND NOT EXISTS (SELECT 1 FROM pg_attribute a
                    WHERE a.attrelid = to_regclass($1) AND a.attname = c.name AND a.attnum > 0 AND NOT a.attisdropped)`

// AddColumns adds them to a table made without them. Migrate sends it only
// when MissingColumns names one: ALTER TABLE takes the table's ACCESS
// EXCLUSIVE lock even when IF NOT EXISTS finds the column, and would queue
// every claim behind the longest transaction on the table at each
// replica's start. Nullable, with no default: adding them rewrites
// nothing; a row without a tick is a lease of no tick, one without a
// release time a lease not released.
const AddColumns = `ALTER TABLE {table} ADD COLUMN IF NOT EXISTS tick timestamptz, ADD COLUMN IF NOT EXISTS released_at timestamptz`

// DefaultTable is the name of the lease table when WithTable is not given.
const DefaultTable = "lease"

// MinRetention is the shortest purge horizon WithRetention, Admin.Purge
// and `pglease purge` accept: a claim draws its fence before it inserts
// its row, and a shorter horizon would let a claim stalled in between find
// the row purged and insert a fence smaller than one already handed out.
const MinRetention = time.Hour

// DefaultRetention is the purge horizon of Migrate and `pglease migrate`
// when none is given: a day of expired rows kept for Admin.List and the
// ledger of runs, far above MinRetention.
const DefaultRetention = 24 * time.Hour

// Purge deletes rows expired longer than the retention ($1, in seconds)
// ago. It is the only DELETE pglease runs, in Migrate and Purge (and so
// `pglease purge`): only expired rows can match, so a live lease is never
// deleted, and a purged key that is claimed again gets its fence from the
// sequence, so it still grows. The retention is never below MinRetention: a
// claim that drew its fence before a later lease of the key was handed out
// would otherwise find the row gone and insert the smaller fence (see
// MinRetention).
//
// It keeps every row that carries a tick, however old: the row is the only
// record that its job's tick ran, and a claim may still come for that tick
// up to half the job's period after it (a weekly job's, days later), which
// without the row would run it again. A retired job's row stays until an
// operator deletes it. The tick is read through to_jsonb, so that a table
// without the column (WithoutFenceColumn, or made before it) purges too;
// in a table without it, the tick is in the holder (UnfencedClaimTick), and
// a row whose holder ends with one is kept alike.
const Purge = `DELETE FROM {table} AS t WHERE expires_at < clock_timestamp() - make_interval(secs => $1)
   AND to_jsonb(t) ->> 'tick' IS NULL
   AND NOT (t.holder ~ ` + tickPattern + ` COLLATE "C")`

// MigrateLock serializes concurrent Migrate calls on one table (two
// concurrent CREATE TABLE IF NOT EXISTS can still collide in the catalog).
// Transaction-scoped, so it also works behind PgBouncer in transaction mode.
const MigrateLock = `SELECT pg_advisory_xact_lock($1)`

// TableCheck reads, in one statement, what Migrate and a Locker's claims
// (its first, then one per ten seconds of claims) refuse in a table and
// sequence they did not create as they are (a
// migration tool may have altered schema.sql, CREATE ... IF NOT EXISTS
// keeps what it finds): the fence sequence ($2, its quoted name; found is
// false when that name is not a sequence, as when a table or view of the
// name was there first), and the key column of the table ($1) when its
// collation is nondeterministic, with its type for the fix.
//
//   - seqcache: each session draws its own block of that many values, so
//     with CACHE n successive mandates of one key, claimed through
//     different sessions, get fences 1, n+1, 2: backwards.
//   - seqcycle: at its maximum the sequence starts over from its minimum.
//   - seqmax: a reachable maximum (an integer sequence, a MAXVALUE) makes
//     every claim fail once it is reached.
//   - seqincrement: anything but 1 (a negative step counts down) is not what
//     fences are documented to do.
//   - a nondeterministic collation of key (an ICU collation made with
//     deterministic = false, such as the case-insensitive
//     'und-u-ks-level2') makes the primary key and every key = $1 match
//     keys that differ in bytes ("Report" and "REPORT"): two keys share
//     one row, and a lease claimed under one spelling is lost at its first
//     heartbeat. No statement can compare bytewise past the unique index
//     ON CONFLICT uses, so the table is refused.
//   - tablepersistence, seqpersistence: an UNLOGGED ('u') or TEMPORARY
//     ('t') table or sequence is emptied by a crash (CREATE UNLOGGED ...
//     from schema.sql, ALTER ... SET UNLOGGED): every live lease could be
//     claimed again, or every fence issued again. The table's is the
//     worst of the table and of every partition of it (a partitioned
//     table holds no rows: its partitions do), partitionrel names the
//     partition when it is one (pg_partition_tree is empty for a table
//     that is not partitioned).
//   - keybase: the key column's type, a domain's base type (through
//     domains over domains): only text and varchar compare keys bytewise. citext folds case, char(n) ignores
//     trailing spaces, name truncates at 63 bytes: two keys would share
//     one row, as with a nondeterministic collation.
//   - keyindex: an index on key of a nondeterministic collation (its name
//     and the collation's): ON CONFLICT (key) infers any unique index on
//     the column whatever its collation, and the claim then takes the row
//     of another spelling of the key.
//   - fencefromseq: the fence default is exactly nextval of the sequence;
//     an expression around it (nextval(...) + 1000) gives new rows fences
//     that re-claims, drawing nextval itself, go back below.
//   - fenceidentity, fencefromseq: a new row's fence comes from the fence
//     column's default, a re-claim's from nextval of the sequence; a
//     default that does not draw from it (an identity column, as ORMs
//     declare a bigint column, or nextval of another sequence) gives a
//     key's next mandate a smaller fence. An identity is not in pg_attrdef;
//     a default's use of a sequence is its pg_depend row on it.
//     fencefound is false when the table has no fence column.
//   - missing: the columns added since the first tables were made
//     (MissingColumns), which the fenced statements write.
//   - timecolumns: expires_at and acquired_at when either is not a
//     timestamptz of full precision, with its type; a domain is judged by
//     its base type (through domains over domains) and the precision the
//     column or the nearest domain gives it (a domain column's own typmod
//     is -1). A timestamp without
//     time zone reads clock_timestamp() in the session's time zone, so a
//     replica whose TimeZone is ahead sees a live lease expired and takes
//     it; timestamptz(0) rounds each expiry to the second, past the
//     trust margin of a short TTL, so another replica takes the key while
//     its holder still trusts it.
//
// From the catalogs (pg_sequence, not the pg_sequences view), which the
// runtime role reads without privileges on the sequence. It returns one
// row always: (VALUES (1)) anchors the outer joins.
const TableCheck = `SELECT s.seqrelid IS NOT NULL, coalesce(s.seqincrement, 0), coalesce(s.seqmax, 0),
       coalesce(s.seqcache, 0), coalesce(s.seqcycle, false),
       coalesce(k.coll, ''), coalesce(k.typ, ''),
       coalesce((SELECT c.relpersistence::text FROM pg_class c
                  WHERE c.oid = to_regclass($1) OR c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)))
                  ORDER BY c.relpersistence = 'p', c.oid <> to_regclass($1) LIMIT 1), ''),
       coalesce((SELECT c.oid::regclass::text FROM pg_class c
                  WHERE c.oid IN (SELECT relid FROM pg_partition_tree(to_regclass($1)))
                    AND c.oid <> to_regclass($1) AND c.relpersistence <> 'p'
                  LIMIT 1), ''),
       coalesce((WITH RECURSIVE b(typ, depth) AS (
                   SELECT a.atttypid, 0 FROM pg_attribute a
                    WHERE a.attrelid = to_regclass($1) AND a.attname = 'key' AND NOT a.attisdropped
                   UNION ALL
                   SELECT ty.typbasetype, b.depth + 1 FROM b JOIN pg_type ty ON ty.oid = b.typ WHERE ty.typbasetype <> 0)
                 SELECT b.typ::regtype::text FROM b ORDER BY b.depth DESC LIMIT 1), ''),
       coalesce((SELECT i.indexrelid::regclass::text || ' ' || co.oid::regcollation::text
                   FROM pg_index i
                  CROSS JOIN LATERAL unnest(i.indkey::int2[], i.indcollation::oid[]) AS u(attnum, coll)
                   JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = u.attnum AND a.attname = 'key'
                   JOIN pg_collation co ON co.oid = u.coll
                  WHERE i.indrelid = to_regclass($1) AND NOT co.collisdeterministic LIMIT 1), ''),
       coalesce((SELECT c.relpersistence::text FROM pg_class c WHERE c.oid = to_regclass($2)), ''),
       f.attnum IS NOT NULL, coalesce(f.attidentity::text, ''),
       EXISTS (SELECT FROM pg_attrdef d
                WHERE d.adrelid = f.attrelid AND d.adnum = f.attnum
                  AND pg_get_expr(d.adbin, d.adrelid) = format('nextval(%L::regclass)', to_regclass($2)::text)),
       coalesce((SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attname)
                   FROM pg_attribute a
                  CROSS JOIN LATERAL (
                        WITH RECURSIVE b(typ, mod, depth) AS (
                          SELECT a.atttypid, a.atttypmod, 0
                          UNION ALL
                          SELECT ty.typbasetype, CASE WHEN b.mod = -1 THEN ty.typtypmod ELSE b.mod END, b.depth + 1
                            FROM b JOIN pg_type ty ON ty.oid = b.typ WHERE ty.typbasetype <> 0)
                        SELECT b.typ, b.mod FROM b ORDER BY b.depth DESC LIMIT 1) AS base
                  WHERE a.attrelid = to_regclass($1) AND a.attname IN ('expires_at', 'acquired_at') AND NOT a.attisdropped
                    AND (base.typ <> 'timestamptz'::regtype OR base.mod NOT IN (-1, 6))), ''),
       (` + missingColumns + `)
  FROM (VALUES (1)) AS one(x)
  LEFT JOIN pg_sequence s ON s.seqrelid = to_regclass($2)
  LEFT JOIN (SELECT a.attcollation::regcollation::text AS coll, format_type(a.atttypid, a.atttypmod) AS typ
               FROM pg_attribute a JOIN pg_collation c ON c.oid = a.attcollation
              WHERE a.attrelid = to_regclass($1) AND a.attname = 'key' AND NOT a.attisdropped
                AND NOT c.collisdeterministic) AS k ON true
  LEFT JOIN pg_attribute f ON f.attrelid = to_regclass($1) AND f.attname = 'fence' AND NOT f.attisdropped`

// FenceBehind reads, once the fence column is known to draw from the
// sequence ($1, its quoted name), the largest fence of the table and the
// sequence's last value: a sequence restarted behind its table's fences (a
// migration tool's down-and-up, a dump restored without setval) gives a
// key's next mandate a smaller fence than the row's. pg_sequence_last_value
// needs SELECT or USAGE on the sequence, which the runtime role has (a read
// of the sequence itself would need SELECT); it is NULL when the sequence
// has issued nothing since its creation, a RESTART or a setval(..., false),
// when nextval returns a value the catalogs do not show: seqstart - 1
// stands for it while the table has no fence, and otherwise one nextval
// is drawn to read it (a fence skipped, which costs nothing: fences must
// only grow). max(fence) reads the whole table, which stays a few pages,
// once per Locker and ten seconds of claims.
const FenceBehind = `SELECT m.fence, coalesce(pg_sequence_last_value(s.seqrelid),
         CASE WHEN m.fence > 0 THEN nextval(s.seqrelid) - 1 ELSE s.seqstart - 1 END)
  FROM pg_sequence s, (SELECT coalesce(max(fence), 0) AS fence FROM {table}) m
 WHERE s.seqrelid = to_regclass($1)`
