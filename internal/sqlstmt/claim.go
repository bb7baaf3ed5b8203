package sqlstmt

import "strings"

// deferSyncCommit makes a claim commit without waiting for the WAL flush
// unless it takes a row: it saves the session's synchronous_commit (its
// own, its role's, its database's or the server's default) in
// pglease.synchronous_commit and turns the setting off, both for this
// transaction only. It sits in the claim's clock subquery, evaluated once
// per statement before any row is judged (PostgreSQL never pulls up a
// subquery whose output calls a volatile function). A claim that takes
// nothing has nothing worth a flush: one that only read (claimFree) has no
// transaction id and commits nothing, and one that locked a row it then lost
// (a claim racing the winner of an expired row, whose ON CONFLICT locks the
// row before judging it) would otherwise hold that row locked, against the
// holder's release, until its flush; its lock record lost in a crash costs
// nothing. raiseSyncCommit puts the setting back, raised, for every row the
// claim takes.
//
// It defers only once per transaction: when pglease.synchronous_commit is
// already set (an earlier claim of the same transaction, where a DB hands
// the Locker a connection inside a transaction of its owner's), it leaves
// synchronous_commit as that claim left it, raised if it took a row, so a
// later claim that takes nothing cannot turn the flush of an acknowledged
// claim off.
const deferSyncCommit = `CASE WHEN NULLIF(current_setting('pglease.synchronous_commit', true), '') IS NOT NULL
            THEN current_setting('synchronous_commit')
            ELSE set_config('synchronous_commit',
                   CASE WHEN set_config('pglease.synchronous_commit', current_setting('synchronous_commit'), true) IS NOT NULL
                        THEN 'off' END, true) END`

// raiseSyncCommit raises synchronous_commit, for this transaction only,
// to the setting the claim found (deferSyncCommit saved it) when that is
// on, remote_write or remote_apply, and to on otherwise: off would let a
// crash lose a write that was acknowledged to the caller, and local would
// let a failover to a synchronous standby lose it, while a stronger setting
// is the operator's choice. A setting still in force (not deferred: an
// earlier claim of the transaction raised it, or the session preset
// pglease.synchronous_commit) is kept when it is at least on's level, so
// that no value in pglease.synchronous_commit, however set, can weaken it.
// It is evaluated inside the statement, so it costs no round trip.
const raiseSyncCommit = `set_config('synchronous_commit',
         CASE WHEN current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply')
              THEN current_setting('synchronous_commit')
              WHEN current_setting('pglease.synchronous_commit', true) IN ('remote_write', 'remote_apply')
              THEN current_setting('pglease.synchronous_commit', true)
              ELSE 'on' END, true)`

// raiseSessionSyncCommit is raiseSyncCommit for a statement that did not
// defer the setting (the heartbeat): it reads the session's own.
const raiseSessionSyncCommit = `set_config('synchronous_commit',
         CASE WHEN current_setting('synchronous_commit') IN ('off', 'local') THEN 'on'
              ELSE current_setting('synchronous_commit') END, true)`

// claimConflict is the conflict arm of Claim and ClaimAll, and its guard:
// a burst judges each row exactly as a claim alone.
//
// expires_at = GREATEST(lease.expires_at, EXCLUDED.expires_at): a claim never
// moves the expiry of the row it takes over back. The arm only fires for an
// expired row (whose expiry is past, so the claim's own wins) or for a row of
// the same holder: a re-entrant claim, which may carry a shorter TTL than the
// lease it supersedes (a job's, Locker.Job). That lease stays trusted by its
// Locker until the claim's reply arrives, and not at all if the reply is
// lost or the claim reaches the server after its sender gave up; if the claim
// could cut the row's expiry short, another holder could claim the key while
// that lease is still trusted. With GREATEST, a claim arriving at any moment
// leaves the row live at least as long as any earlier mandate of the holder
// was told: only the new mandate's own heartbeat or release, which match its
// fence, can shorten it, and the Locker ends the earlier lease before either
// is sent.
//
// released_at = NULL: the row is a live mandate again, not a released one.
const claimConflict = `ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = GREATEST(lease.expires_at, EXCLUDED.expires_at),
       acquired_at = EXCLUDED.acquired_at,
       released_at = NULL,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder COLLATE "C" OR lease.expires_at <= clock_timestamp()
`

// claimFree is the read that makes a losing claim cost a read: the claim's
// SELECT yields no row when the key has a live lease of another holder
// (c.key is the key, h.holder the claiming holder). With no row to insert, the
// INSERT takes no row lock, gets no transaction id, writes no WAL and waits
// for no flush at commit; without it, ON CONFLICT DO UPDATE would lock the
// conflicting row before evaluating its WHERE, and a losing claim would cost
// a lock record, a commit record and a synchronous WAL flush, while the
// holder's release, which skips locked rows, would find the row locked by
// the losers and be sent again and again.
//
// The read uses the statement's snapshot and the claim's own clock reading
// (clock.t). A row it does not see (inserted by a claim that committed after
// the snapshot) or sees expired is still judged by the conflict arm, after
// its lock: every outcome is the one the conflict arm alone gives, but that
// a foreign live row, locked by a transaction in flight, is ErrHeld at once
// rather than after the lock is released (the claim then linearizes before
// that transaction).
const claimFree = `NOT EXISTS (SELECT 1 FROM {table} AS cur
                   WHERE cur.key = c.key AND cur.expires_at > clock.t
                     AND cur.holder <> h.holder COLLATE "C")`

// Claim takes a key in one statement and one round trip.
//
//   - INSERT ... ON CONFLICT, not a pure UPDATE: a missing row must become a
//     lease, not look like "held by another".
//   - The conflict arm only fires for our own holder (re-entrant claim) or an
//     expired row; otherwise no row comes back, which is ErrHeld.
//   - fence takes nextval on every claim, re-entrant ones included, so a
//     previous mandate's late heartbeat or release matches nothing, and the
//     fence never restarts after a purge.
//   - acquired_at and expires_at come from one clock_timestamp() reading
//     (PostgreSQL never pulls up a subquery whose output calls a volatile
//     function, so it is read once): expires_at = acquired_at + TTL, and
//     CHECK (expires_at > acquired_at) holds whatever the server's clock
//     does between two readings. DO UPDATE takes both from EXCLUDED: they were evaluated
//     before any wait on the row lock, and clock_timestamp() there would
//     break the CHECK after a wait longer than the TTL (SQLSTATE 23514).
//   - The claim commits asynchronously (deferSyncCommit) unless it takes a
//     row: RETURNING raises synchronous_commit back (raiseSyncCommit) for
//     every row the claim takes, before its commit, where the setting is
//     read. A claim acknowledged to the caller must survive a crash, or
//     after the restart another holder would claim the same live key and
//     the sequence, whose advance was lost with it, would issue the same
//     fences again. A claim that takes nothing has nothing worth a flush,
//     and one that only locked a row it then lost would otherwise hold that
//     row locked, against the holder's release, until its flush.
//   - claimFree: a claim of a key another holder's live lease has returns
//     no row having only read it: no lock, no transaction id, no WAL.
//   - live reports whether the lease is still unexpired after that wait; a
//     claim that returns live = false hands out nothing.
//   - tableoid names the very table the row is in, which the transaction
//     of a Guard may resolve differently (another search_path).
//
// The alias keeps the statement the same whatever the table is called.
const Claim = `INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at)
SELECT c.key, h.holder, clock.t, clock.t + make_interval(secs => $3)
  FROM (SELECT clock_timestamp() AS t, ` + deferSyncCommit + ` AS sync) AS clock,
       (SELECT $1::text AS key) AS c, (SELECT $2::text AS holder) AS h
 WHERE clock.sync IS NOT NULL AND ` + claimFree + `
` + claimConflict + `RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid, ` + raiseSyncCommit + ` AS durable`

// ClaimAll is Claim for every claim of a burst, in one statement,
// one commit and one WAL flush: the claims a Locker is asked for while
// another claim statement is in flight (pglease's coalescer). Each key is one
// row, judged exactly as Claim judges it.
//
//   - One row per key of unnest($3), never the same key twice: PostgreSQL
//     refuses to update a row twice in one statement, and the Locker's
//     keyTurns keeps a
//     second claim of a key for the next statement.
//   - ORDER BY key COLLATE "C": rows are locked in the order they are
//     inserted, so two Lockers' bursts lock common keys in the same order
//     and cannot deadlock each other.
//   - Each claim has its own TTL ($2, one per key, beside the keys): claims
//     of jobs with their own TTL (Locker.Job) still share one statement.
//   - acquired_at and expires_at come from one clock_timestamp() reading, in
//     a subquery PostgreSQL never pulls up (see Claim), taken before any
//     wait on a row lock: the CHECK (expires_at > acquired_at) holds for
//     every row, and the expiry is never later than a claim sent alone at
//     the same moment would get.
//   - The same conflict arm and guard as Claim (claimConflict), and the
//     same RETURNING but for the key (a test keeps them identical): a row
//     comes back only for a key taken (new, expired, or our own); a key
//     missing from RETURNING is ErrHeld. live is false for a row whose lease expired while the
//     statement waited on its lock.
//   - Synchronous commit raised as in Claim, by every row it takes.
//   - lock_timeout ($4), for this transaction only: a row locked by another
//     transaction (an operator's, a long one) would hold up every claim of
//     the burst. Past it the statement fails with SQLSTATE 55P03 and each
//     claim is sent again alone, so that only the claim of the locked row
//     waits, as it would have alone. A claim of another replica in flight
//     holds a row for one commit, well under it.
const ClaimAll = `INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at)
SELECT c.key, h.holder, clock.t, clock.t + make_interval(secs => c.ttl)
  FROM (SELECT clock_timestamp() AS t, ` + deferSyncCommit + ` AS sync) AS clock,
       (SELECT $1::text AS holder) AS h, unnest($3::text[], $2::float8[]) AS c(key, ttl)
 WHERE clock.sync IS NOT NULL AND ` + claimFree + `
   AND set_config('lock_timeout', $4, true) IS NOT NULL
 ORDER BY c.key COLLATE "C"
` + claimConflict + `RETURNING key, fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid, ` + raiseSyncCommit + ` AS durable`

// UnfencedClaim is Claim for a table without a fence column.
//
//   - $2 is a holder identifier forged for this mandate alone: a late
//     heartbeat or release of an earlier mandate carries another one and
//     matches nothing.
//   - The conflict arm's first test keeps re-entrant claims working: a
//     Locker may take back its own live lease, and only that. $4 is the
//     Locker's holder (its name, '#', a suffix of its own) and '#'; the
//     row's holder must be exactly what the Locker's forge makes of it:
//     that prefix, then 16 lowercase hex digits, nothing more. A prefix
//     test alone would take the live lease of a replica of an older
//     library whose plain holder merely starts the same way
//     ("host-1#worker"). The prefix is compared by equality, not
//     by LIKE or a regular expression, so that no character of a holder
//     acts as a pattern; COLLATE "C" makes the comparisons bytewise even
//     when the column has a case-insensitive collation.
//   - {acq}, {acqval} and {acqset} add acquired_at when the table has it
//     (UnfencedClaimFor); its value is evaluated before any wait on the
//     row lock, as in Claim.
//   - RETURNING raises synchronous_commit for the row it takes, as in
//     Claim: an acknowledged claim survives a crash.
//   - expires_at = GREATEST(...): a claim never moves the expiry of a row
//     it takes over back, as in Claim (claimConflict).
//   - The acquired time handed back is the expiry minus the TTL, or the
//     server's clock at the end of the statement if that is earlier (the
//     row kept a later expiry): the server's time of the claim, known even
//     when the table has no acquired_at column. UnfencedRelease measures
//     the min hold from it.
//   - lock_timeout ($5, for this transaction only, when not NULL), set
//     before the row is locked, as in ClaimAll: a claim sent when claims
//     may no longer wait on a row lock without bound waits on its row at
//     most that long (SQLSTATE 55P03), holding its connection no longer,
//     and is sent again after a pause. NULL leaves the session's setting.
const UnfencedClaim = `INSERT INTO {table} AS lease (key, holder, expires_at{acq})
SELECT $1, $2, clock.t + make_interval(secs => $3){acqval}
  FROM (SELECT clock_timestamp() AS t, ` + deferSyncCommit + ` AS sync) AS clock
 WHERE clock.sync IS NOT NULL
   AND ($5::text IS NULL OR set_config('lock_timeout', $5::text, true) IS NOT NULL)
ON CONFLICT (key) DO UPDATE
   SET holder     = EXCLUDED.holder,
       expires_at = GREATEST(lease.expires_at, EXCLUDED.expires_at){acqset}
 WHERE (length(lease.holder) = length($4::text) + 16
        AND left(lease.holder, length($4::text)) = $4::text COLLATE "C"
        AND right(lease.holder, 16) ~ '^[0-9a-f]{16}$' COLLATE "C")
    OR lease.expires_at <= clock_timestamp()
RETURNING LEAST(expires_at - make_interval(secs => $3), clock_timestamp()), expires_at, expires_at > clock_timestamp() AS live, tableoid,
          ` + raiseSyncCommit + ` AS durable`

// UnfencedClaimTick is ClaimTick for a table without a fence column,
// whose only free text is the holder: the tick travels in it. The holder
// written is the one forged for this mandate ($2), '@' and the tick in
// UTC with microseconds (TickLayout: fixed width, so that two ticks
// compare as text in the order of time, COLLATE "C", and Go parses it
// back exactly); the row's tick is read back from its holder (curTick,
// leaseTick), NULL when the holder carries none.
//
//   - The tick is judged as ClaimTick judges it (tickInstant, tickNearest):
//     the period's grid or the instants of a crontab ($7), nearest the
//     server's clock, and a stale claim returns its row ('epoch' asked,
//     the server's clock as acquired_at). $6 (a catch-up) is always NULL:
//     without released_at a released run cannot be told from a lapsed one.
//   - The claim takes the row only if it is expired and its holder's tick
//     is absent or earlier: never a live row, not even one of this
//     replica's own forged holders, so a run of an earlier tick keeps its
//     lease, and a tick run and released (expired in place, its holder
//     kept) is never run again. The read before the insert refuses a live
//     row or a later tick having only read, as claimFree does; a row it
//     does not see is judged by the conflict arm, after its lock.
//   - Otherwise as UnfencedClaim: {acq} placeholders, lock_timeout ($5),
//     the deferred and raised synchronous commit, an expiry never moved
//     back, the acquired time from the expiry (the arm takes only an
//     expired row, so it is the claim's clock), RETURNING the holder
//     written, which the heartbeat and the release then match whole.
//   - A claim that takes nothing returns the row as it was (took = false),
//     its holder and its tick (as text, NULL if none), for the error that
//     says why; without a row, nothing.
const UnfencedClaimTick = `WITH ` + tickInstant + `,
     nearest AS (` + tickNearest + `),
     taken AS (
INSERT INTO {table} AS lease (key, holder, expires_at{acq})
SELECT $1::text, $2::text || '@' || ` + nearestTick + `, clock.t + make_interval(secs => $3){acqval}
  FROM (SELECT t, sync FROM instant) AS clock, nearest
 WHERE clock.sync IS NOT NULL AND nearest.at IS NOT NULL
   AND NOT EXISTS (SELECT 1 FROM {table} AS cur WHERE cur.key = $1::text
                      AND (cur.expires_at > clock.t OR ` + curTick + ` >= ` + nearestTick + ` COLLATE "C"))
   AND ($5::text IS NULL OR set_config('lock_timeout', $5::text, true) IS NOT NULL)
ON CONFLICT (key) DO UPDATE
   SET holder     = EXCLUDED.holder,
       expires_at = GREATEST(lease.expires_at, EXCLUDED.expires_at){acqset}
 WHERE lease.expires_at <= clock_timestamp()
   AND (` + leaseTick + ` IS NULL OR ` + leaseTick + ` < right(EXCLUDED.holder, ` + tickLen + `) COLLATE "C")
RETURNING holder, LEAST(expires_at - make_interval(secs => $3), clock_timestamp()) AS acquired_at, expires_at,
          expires_at > clock_timestamp() AS live, tableoid, ` + raiseSyncCommit + ` AS durable)
SELECT true AS took, holder, acquired_at, expires_at, live, tableoid, (SELECT at FROM nearest) AS asked, NULL::text AS rowtick FROM taken
UNION ALL
SELECT false, cur.holder, instant.t, cur.expires_at, cur.expires_at > instant.t, cur.tableoid, nearest.at, ` + curTick + `
  FROM instant, nearest, {table} AS cur
 WHERE cur.key = $1::text AND nearest.at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM taken)
UNION ALL
SELECT false, '', instant.t, instant.t, false, 0, 'epoch', NULL
  FROM instant, nearest
 WHERE nearest.at IS NULL`

// TickLayout is the form of the tick in a holder of UnfencedClaimTick (Go's
// layout of nearestTick's): it follows the forged holder and '@'.
const TickLayout = "2006-01-02T15:04:05.000000Z"

// TickSuffixLen is how many characters the tick adds to a forged holder:
// '@' and the tick.
const TickSuffixLen = 1 + len(TickLayout)

// The tick in a holder (UnfencedClaimTick): nearestTick writes it,
// curTick and leaseTick read it from the row (cur in a read, lease in the
// conflict arm), NULL unless the holder ends with '@' and a tick of that
// exact form. tickLen is len(TickLayout).
const (
	tickLen     = `27`
	tickPattern = `'@[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6}Z$'`
	nearestTick = `to_char(nearest.at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"')`
	curTick     = `CASE WHEN cur.holder ~ ` + tickPattern + ` COLLATE "C" THEN right(cur.holder, ` + tickLen + `) END`
	leaseTick   = `CASE WHEN lease.holder ~ ` + tickPattern + ` COLLATE "C" THEN right(lease.holder, ` + tickLen + `) END`
)

// Columns lists the table's columns, to check it has what
// WithoutFenceColumn needs. to_regclass resolves the name as the statements will.
const Columns = `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypmod, a.attnotnull, a.atthasdef,
       EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indkey[0] = a.attnum AND i.indpred IS NULL)
  FROM pg_attribute a
 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// UnfencedClaimFor is UnfencedClaim for a table with an acquired_at column
// (hasAcquired) or without one: the template with its {acq} placeholders
// filled, still to be rendered.
func UnfencedClaimFor(hasAcquired bool) string { return withAcquired(UnfencedClaim, hasAcquired) }

// UnfencedClaimTickFor is UnfencedClaimTick as UnfencedClaimFor is
// UnfencedClaim.
func UnfencedClaimTickFor(hasAcquired bool) string {
	return withAcquired(UnfencedClaimTick, hasAcquired)
}

// withAcquired fills the {acq} placeholders of an unfenced claim.
func withAcquired(stmt string, hasAcquired bool) string {
	acq, acqval, acqset := "", "", ""
	if hasAcquired {
		acq, acqval, acqset = ", acquired_at", ", clock.t", ",\n       acquired_at = EXCLUDED.acquired_at"
	}
	return strings.NewReplacer("{acq}", acq, "{acqval}", acqval, "{acqset}", acqset).Replace(stmt)
}

// RowLease reads the lease a key's row carries now: its holder, its fence,
// and whether it is live on the server's clock. A claim whose outcome the
// Locker never learned (its reply lost, its context ended in flight) sends
// it before giving back what that claim may have committed, so that the
// give-back acts on exactly one lease, named by its fence: a read is
// harmless however late it arrives, and a release of that fence arriving
// after a newer claim touches nothing.
//
//   - FOR SHARE: a claim that reached the server before the read and has
//     not committed yet (its commit waiting for a WAL flush or a
//     synchronous standby, which a cancel request cannot cut short, or
//     the row lock it waits on) holds the row; a plain read would see the
//     row as it was, and the claim would then commit a row nobody holds,
//     live to its expiry. The read waits for that transaction to end and
//     reads the row as it left it. FOR KEY SHARE would not: a claim's
//     update leaves the key as it is, and that lock lets such an update
//     by. A heartbeat or release that meets the lock waits out the read's
//     one statement (a release skips the row and sends it again).
//   - lock_timeout ($2, for this transaction only, set before the row is
//     reached) bounds that wait: a row locked longer fails the read with
//     SQLSTATE 55P03, and the Locker says what it could not give back.
//   - set_config('synchronous_commit', 'off', true): the lock is written to
//     the WAL, so the read has a commit of its own; lost in a crash, it
//     costs nothing, and it must not wait for a synchronous standby.
const RowLease = `SELECT holder, fence, expires_at > clock_timestamp() FROM {table}
 WHERE key = $1
   AND set_config('lock_timeout', $2, true) IS NOT NULL
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL
   FOR SHARE`

// lapsedCur and lapsedLease are true of a row (cur in a read, lease in
// the conflict arm) whose run lapsed: expired without a release, and not
// revoked.
//
// The row's mandate must be a run of its tick, in the ledger: a plain claim
// of the key (no tick of its own) keeps the row's tick, and its lapse is
// not the lapse of that tick's run.
const (
	lapsedCur = `cur.expires_at <= clock.t AND cur.released_at IS NULL AND cur.holder <> '` + RevokedHolder + `'
                      AND EXISTS (SELECT 1 FROM {runs} AS run WHERE run.fence = cur.fence AND run.tick = cur.tick)`
	lapsedLease = `lease.expires_at <= clock_timestamp() AND lease.released_at IS NULL AND lease.holder <> '` + RevokedHolder + `'
            AND EXISTS (SELECT 1 FROM {runs} AS run WHERE run.fence = lease.fence AND run.tick = lease.tick)`
)

// tickInstant and tickNearest are the parts of a claim of a tick
// (ClaimTick, UnfencedClaimTick) that read the server's clock once and
// judge the tick from it: nearest.at is the tick of the period ($4, in
// microseconds) nearest instant.t, or the instant of $7 nearest it, or
// the catch-up's tick ($6); NULL when instant.t lies outside the instants
// sent (a stale claim). ClaimTick says why they are shaped so.
const (
	tickInstant = `instant AS (SELECT clock_timestamp() AS t, ` + deferSyncCommit + ` AS sync)`
	tickNearest = `SELECT coalesce($6::timestamptz,
                            to_timestamp(0) + make_interval(secs => ((us + $4::bigint / 2) / $4::bigint * $4::bigint) / 1000000.0),
                            (SELECT c FROM unnest($7::timestamptz[]) AS c,
                                           (SELECT min(x) AS lo, max(x) AS hi FROM unnest($7::timestamptz[]) AS x) AS sent
                              WHERE now_us.t BETWEEN sent.lo AND sent.hi
                              ORDER BY abs(extract(epoch FROM c - now_us.t)), c DESC LIMIT 1)) AS at
                   FROM (SELECT round(extract(epoch FROM instant.t) * 1000000)::bigint AS us, instant.t FROM instant) AS now_us`
)

// ClaimTick is Claim of one tick of a job's schedule: the run of that tick,
// at most once whoever claims it and however late. $4 is the job's period
// in microseconds; the tick claimed is the multiple of it since the Unix
// epoch nearest the server's clock (instant.t, read once, in whole
// microseconds, a half rounded up), whatever the claimer's clock says and
// however long the statement took to arrive, so replicas whose clocks are
// off by less than half the period agree on it. A job of a crontab sends
// no period ($4 NULL) but some of its instants ($7: the two before the
// claimer's clock and the two after it), and the tick is the one of them
// nearest the server's clock (a tie to the later, as for a period): the
// nearest instant of the crontab whenever the clocks are off by less than
// half the shortest time between two of its instants. Those sent are
// consecutive instants, so the nearest is among them only when the
// server's clock lies between the first and the last: otherwise (the
// statement arrived late, or the clocks differ by more) the claim takes
// nothing and returns the row of a stale claim (asked 'epoch', the
// server's clock as acquired_at), from which the claimer sends instants
// around the server's clock instead.
//
//   - tick is stored in the row with the lease and never moved back: a
//     claim takes the row only for a tick after the row's (in the read
//     and in the conflict arm), so a tick run and released, lapsed or
//     revoked is never run again, and no min hold is needed.
//   - Otherwise the claim is Claim: claimFree, claimConflict's rules for a
//     live row, the deferred synchronous commit, one clock reading.
//   - lock_timeout ($5, when not NULL), as in UnfencedClaim: a claim that
//     may not wait on a row lock without bound waits at most that long.
//   - The run is entered in the ledger ({runs}) by the same statement, if
//     it is live (a claim that waited on the row's lock past its TTL hands
//     out nothing, and runs nothing),
//     and the run whose row it took over (prev: the row as the statement's
//     snapshot shows it) is closed there with how it ended: completed if
//     its holder released it, revoked, superseded if it was still live
//     (its own holder's claim of a later tick), lapsed otherwise. No round
//     trip of its own, and no write for a claim that takes nothing but
//     the one below.
//   - skip: a claim refused because the run of an earlier tick still holds
//     the key (live, its tick before the nearest: the replicas' event
//     Skipped) enters the tick in the ledger as skipped, under the fence
//     of the row that held the key: the ledger's key (fence, tick) makes
//     the other replicas' inserts of it do nothing, and no fence is drawn
//     for it. Only such a claim writes; the usual losing claim, of a tick
//     another replica took, finds the row's tick equal to the nearest and
//     writes nothing. A catch-up never skips: it asks for the tick of the
//     run it waits for. Like a release, the skip is committed without
//     waiting for its flush: a server crash may lose it.
//   - A tick whose claim was given back (its outcome unknown, or answered
//     past its trust window: the ledger says 'given back') ran nothing, and
//     is taken again once its row has expired, by any claim of that tick.
//   - A catch-up ($6, the tick, when not NULL) claims that tick, not the
//     nearest, and takes the row also when it carries that very tick but
//     its run lapsed (lapsedCur, lapsedLease): expired, never released, not revoked.
//     The run it replaces is closed as lapsed; its holder stopped trusting
//     its lease before the row expired, so the two runs never overlap.
//   - A claim that takes nothing returns the row as it was (took = false):
//     whose it is and its tick say why (the tick was run, or the run of an
//     earlier tick still holds the key), whether it was released, and
//     whether its mandate is a run of its tick (isrun: a plain claim of the
//     key keeps the row's tick), at no cost of a round trip; a row
//     without a tick says 'epoch', so that every driver scans a time. The
//     row is the statement's snapshot's: a claim refused by a row that a
//     concurrent claim committed after it (the tick's winner) finds none,
//     or an earlier tick's that was free, and says the tick it asked
//     (the Locker then knows it lost a race, not why the row refused it).
//
// The tick's own read and the refusal read see the statement's snapshot; a
// row a concurrent claim inserts after it is judged by the conflict arm
// after its lock, as in Claim.
const ClaimTick = `WITH ` + tickInstant + `,
     nearest AS (` + tickNearest + `),
     prev AS (SELECT key, fence, holder, expires_at, released_at, tick FROM {table} WHERE key = $1),
     taken AS (
INSERT INTO {table} AS lease (key, holder, acquired_at, expires_at, tick)
SELECT c.key, h.holder, clock.t, clock.t + make_interval(secs => $3), nearest.at
  FROM (SELECT t, sync FROM instant) AS clock, nearest, (SELECT $1::text AS key) AS c, (SELECT $2::text AS holder) AS h
 WHERE clock.sync IS NOT NULL AND nearest.at IS NOT NULL AND ` + claimFree + `
   AND NOT EXISTS (SELECT 1 FROM {table} AS cur WHERE cur.key = c.key AND cur.tick >= nearest.at
                      AND NOT (cur.tick = nearest.at AND cur.expires_at <= clock.t
                               AND EXISTS (SELECT 1 FROM {runs} AS run WHERE run.fence = cur.fence AND run.outcome = '` + givenBack + `'))
                      AND NOT ($6::timestamptz IS NOT NULL AND cur.tick = $6::timestamptz AND ` + lapsedCur + `))
   AND ($5::text IS NULL OR set_config('lock_timeout', $5::text, true) IS NOT NULL)
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = GREATEST(lease.expires_at, EXCLUDED.expires_at),
       acquired_at = EXCLUDED.acquired_at,
       released_at = NULL,
       fence       = nextval({seqlit}),
       tick        = EXCLUDED.tick
 WHERE (lease.tick IS NULL OR lease.tick < EXCLUDED.tick
        OR (lease.tick = EXCLUDED.tick AND lease.expires_at <= clock_timestamp()
            AND EXISTS (SELECT 1 FROM {runs} AS run WHERE run.fence = lease.fence AND run.outcome = '` + givenBack + `'))
        OR ($6::timestamptz IS NOT NULL AND lease.tick = EXCLUDED.tick AND ` + lapsedLease + `))
   AND (lease.holder = EXCLUDED.holder COLLATE "C" OR lease.expires_at <= clock_timestamp())
RETURNING key, fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live, tableoid, ` + raiseSyncCommit + ` AS durable, holder, tick),
     logged AS (INSERT INTO {runs} (fence, key, tick, holder, started_at)
                SELECT fence, key, tick, holder, acquired_at FROM taken WHERE live),
     closed AS (UPDATE {runs} AS run
                   SET ended_at = LEAST(coalesce(prev.released_at, prev.expires_at), instant.t),
                       outcome  = CASE WHEN prev.holder = '` + RevokedHolder + `' THEN 'revoked'
                                       WHEN prev.released_at IS NOT NULL THEN 'completed'
                                       WHEN prev.expires_at > instant.t THEN 'superseded'
                                       ELSE 'lapsed' END
                  FROM prev, instant
                 WHERE run.fence = prev.fence AND run.outcome IS NULL AND EXISTS (SELECT 1 FROM taken)),
     skip AS (INSERT INTO {runs} (fence, key, tick, holder, started_at, ended_at, outcome)
              SELECT prev.fence, prev.key, nearest.at, $2, instant.t, instant.t, 'skipped'
                FROM prev, nearest, instant
               WHERE NOT EXISTS (SELECT 1 FROM taken) AND $6::timestamptz IS NULL
                 AND prev.expires_at > instant.t AND prev.tick < nearest.at
              ON CONFLICT DO NOTHING)
SELECT true AS took, fence, acquired_at, expires_at, live, tableoid, holder, tick AS rowtick, tick AS asked, false AS released, true AS isrun FROM taken
UNION ALL
SELECT false, cur.fence, cur.acquired_at, cur.expires_at, cur.expires_at > instant.t, cur.tableoid, cur.holder,
       COALESCE(cur.tick, 'epoch'), nearest.at, cur.released_at IS NOT NULL,
       EXISTS (SELECT 1 FROM {runs} AS run WHERE run.fence = cur.fence AND run.tick = cur.tick)
  FROM instant, nearest, {table} AS cur
 WHERE cur.key = $1 AND nearest.at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM taken)
UNION ALL
SELECT false, 0, instant.t, instant.t, false, 0, '', 'epoch', nearest.at, false, false
  FROM instant, nearest
 WHERE nearest.at IS NOT NULL AND NOT EXISTS (SELECT 1 FROM taken) AND NOT EXISTS (SELECT 1 FROM prev)
UNION ALL
SELECT false, 0, instant.t, instant.t, false, 0, '', 'epoch', 'epoch', false, false
  FROM instant, nearest
 WHERE nearest.at IS NULL`
