package sqlstmt

// Release gives leases back by expiring their rows in place, never by
// DELETE, in one statement and one round trip whatever their number (Unlock
// sends one lease, Close every lease it holds: released one by one, a few
// hundred leases at a few milliseconds per round trip would outlast Close's
// timeout). It reports on each lease: released, or skipped because its row
// is locked by another transaction. A lease missing from the result was
// lost (ErrLost).
//
//   - The guard (holder, fence, not expired) makes a previous mandate's late
//     release touch nothing, and the row of a later mandate is untouched.
//     COLLATE "C": holders are compared byte for byte, whatever collation
//     the column has.
//   - FOR NO KEY UPDATE SKIP LOCKED, the lock the UPDATE takes anyway: a
//     row locked by another transaction (an operator's, a guarded job's,
//     another replica's claim in flight) is skipped, not waited for. A
//     waiting release would hold up the other leases of Close, and, since a
//     heartbeat round may not run while a release is in flight, every
//     heartbeat of the Locker. Skipped rows are told from lost ones as the
//     heartbeat does (the last committed version still matches) and sent
//     again by the Locker, each attempt on its own. They are looked for
//     only when fewer rows were released than asked (a one-time filter):
//     in the usual release, every row is released and that second scan
//     costs nothing.
//   - GREATEST(clock_timestamp(), acquired_at + min hold) keeps the lease
//     until the min hold has passed since the claim (WithMinHold), and
//     otherwise expires it now. Each lease has its own min hold ($2, one
//     per key, beside the keys and fences: a job's, Locker.Job, or the
//     Locker's), so one statement releases leases of every job. The hold is at least 1 microsecond
//     (timestamptz's resolution): after the server's clock steps back,
//     clock_timestamp() can fall at or before acquired_at, and the CHECK
//     (expires_at > acquired_at) would fail the statement. The row then
//     stays held until the clock has caught up with acquired_at.
//   - set_config('synchronous_commit', 'off', true) makes this statement
//     commit without waiting for the WAL flush (the setting is read at
//     commit, before the transaction-local value is reverted). A release
//     lost in a crash only makes the lease last until its expiry: liveness,
//     never safety. (The release that closes a run of a tick waits for
//     its flush: ReleaseRuns.) Claims and heartbeats stay synchronous, and the next
//     synchronous commit flushes the WAL up to and including this release.
//   - pg_notify({chanlit}, key) in RETURNING wakes the claims waiting for
//     the released keys (ClaimWait, an Elector's followers) in the same
//     statement, at its commit: no added statement or round trip. RETURNING
//     runs only for rows actually released, never for a skipped or lost one.
const Release = releaseRows + `, pg_notify({chanlit}, l.key)` + releaseReport

// ReleaseQuiet is Release without the notification, for a release whose
// commit could not get the notification queue's lock within its wait (see
// ReleaseOne): the claims waiting for the keys wake at their expiry or
// next poll instead.
const ReleaseQuiet = releaseRows + releaseReport

// releaseRows is Release up to its notification: the rows it expires.
// lock_timeout ($5, for this transaction only) bounds its commit's wait
// for the notification queue's lock, as in ReleaseOne; the rows themselves
// are skipped when locked, never waited for.
const releaseRows = `WITH r AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[]) AS r(key, fence, min_hold)
), mine AS (
  SELECT l.key, r.min_hold FROM {table} AS l JOIN r ON l.key = r.key AND l.fence = r.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               l.acquired_at + make_interval(secs => mine.min_hold),
                               l.acquired_at + interval '1 microsecond'),
         released_at = clock_timestamp()
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     AND set_config('lock_timeout', $5, true) IS NOT NULL
  RETURNING l.key, l.fence`

// releaseReport is what Release reports: the released rows, then the
// rows skipped because locked.
const releaseReport = `
)` + releaseSelect

// releaseSelect is the SELECT that ends releaseReport and releaseRunReport.
const releaseSelect = `
SELECT key, fence, true FROM released
UNION ALL
SELECT c.key, c.fence, false
  FROM r JOIN {table} AS c ON c.key = r.key AND c.fence = r.fence
 WHERE c.holder = $1 COLLATE "C" AND c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM released)
   AND (SELECT count(*) FROM released) < cardinality($3::text[])`

// ReleaseOne is Release for one lease, an Unlock alone (the usual one): a
// plain UPDATE of one row, which costs the server about half of what
// Release's CTE over arrays does (a row lock taken apart from the update
// and its WAL record, an unnest, a join, and the plan of the second scan).
// The same guard, min hold, asynchronous commit and notification as
// Release; $1 holder, $2 key, $3 fence, $4 min hold in seconds.
//
//   - It waits on the row's lock for at most $5 (lock_timeout, for this
//     transaction only, set before the row is reached): a claim of another
//     replica that met the row as it changed hands holds it for one
//     commit, which waits for no WAL flush (Claim), so the release gets
//     through at once instead of being sent again and again while
//     replicas keep claiming. A row locked for longer (an operator's
//     transaction, a guarded job's) fails the statement with SQLSTATE
//     55P03 once $5 has passed: the Locker counts the row skipped and
//     sends it again later, as Release's skipped rows, and the heartbeat
//     round it holds back meanwhile waits no longer than $5.
//   - The wait bounds the commit too: a notification is queued at commit
//     under a lock of the whole server, which other applications'
//     notifying commits hold through their WAL flush. A statement whose
//     row came back and whose commit then failed with 55P03 released
//     nothing; the Locker sends ReleaseOneQuiet at once, which needs no
//     such lock, so that a busy notification queue can hold a release
//     (and the heartbeat round it keeps out) for no more than twice the
//     wait, and cannot keep it from getting through.
//   - A single row, so the wait cannot close a deadlock: the statement
//     holds no other lock.
//   - A row back: released. None: lost (another mandate took the row, or
//     it lapsed).
const ReleaseOne = releaseOneRow + `
RETURNING pg_notify({chanlit}, l.key)`

// ReleaseOneQuiet is ReleaseOne without the notification, for a release
// whose commit could not get the notification queue's lock within the
// wait: the claims waiting for the key wake at its expiry or their next
// poll instead.
const ReleaseOneQuiet = releaseOneRow + `
RETURNING l.key`

// releaseOneRow is the UPDATE of ReleaseOne and ReleaseOneQuiet.
const releaseOneRow = `UPDATE {table} AS l
   SET expires_at = GREATEST(clock_timestamp(),
                             l.acquired_at + make_interval(secs => $4),
                             l.acquired_at + interval '1 microsecond'),
       released_at = clock_timestamp()
 WHERE l.key = $2 AND l.holder = $1 COLLATE "C" AND l.fence = $3
   AND l.expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL
   AND set_config('lock_timeout', $5, true) IS NOT NULL`

// UnfencedRelease is Release matching each row on its forged holder,
// with each lease's min hold ($1, one per key) counted from the acquired
// time each claim returned (a server time), since the table may have no
// acquired_at column. It wakes the waiting claims of the released keys as
// Release does.
const UnfencedRelease = unfencedReleaseRows + `, pg_notify({chanlit}, l.key)` + unfencedReleaseReport

// UnfencedReleaseQuiet is UnfencedRelease without the notification, as
// ReleaseQuiet is Release without it.
const UnfencedReleaseQuiet = unfencedReleaseRows + unfencedReleaseReport

// unfencedReleaseRows is UnfencedRelease up to its notification, with the
// commit's lock wait ($5) of releaseRows.
const unfencedReleaseRows = `WITH r AS (
  SELECT * FROM unnest($2::text[], $3::text[], $4::timestamptz[], $1::float8[]) AS r(key, holder, acquired_at, min_hold)
), mine AS (
  SELECT l.key, r.acquired_at, r.min_hold FROM {table} AS l JOIN r ON l.key = r.key AND l.holder = r.holder COLLATE "C"
   WHERE l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               mine.acquired_at + make_interval(secs => mine.min_hold),
                               mine.acquired_at + interval '1 microsecond')
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit', 'off', true) IS NOT NULL
     AND set_config('lock_timeout', $5, true) IS NOT NULL
  RETURNING l.key, l.holder`

// unfencedReleaseReport is what UnfencedRelease reports.
const unfencedReleaseReport = `
)
SELECT key, holder, true FROM released
UNION ALL
SELECT c.key, c.holder, false
  FROM r JOIN {table} AS c ON c.key = r.key AND c.holder = r.holder COLLATE "C"
 WHERE c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM released)
   AND (SELECT count(*) FROM released) < cardinality($2::text[])`

// The releases of the leases of jobs with ticks (WithPeriod) close their
// runs in the ledger ({runs}), in the same statement: $6 (one per lease in
// Release's form, beside the keys) is the outcome to write, 'completed'
// for a release, 'given back' for a claim given back (it ran nothing), or
// empty for a lease of no tick, whose row is released as Release does. A
// give-back leaves released_at NULL: the row then reads as a run that
// lapsed, which a catch-up may run (WithCatchUp). Only leases of ticks are
// sent so, so that a table made before the ledger releases as before.
//
// A statement that closes a run as completed or failed commits
// synchronously (runFlush), unlike every other release: a release lost in
// a crash would leave a finished run reading as lapsed in the ledger, and
// a catch-up would run its tick again. One WAL flush per run of a tick;
// releases of plain leases and give-backs stay asynchronous.

// ReleaseRuns is Release closing the runs of the leases of ticks.
const ReleaseRuns = releaseRunRows + `, pg_notify({chanlit}, l.key)` + releaseRunReport

// ReleaseRunsQuiet is ReleaseRuns without the notification, as
// ReleaseQuiet is Release without it.
const ReleaseRunsQuiet = releaseRunRows + releaseRunReport

// releaseRunRows is releaseRows with each lease's outcome.
const releaseRunRows = `WITH r AS (
  SELECT * FROM unnest($3::text[], $4::bigint[], $2::float8[], $6::text[]) AS r(key, fence, min_hold, outcome)
), mine AS (
  SELECT l.key, r.min_hold, r.outcome FROM {table} AS l JOIN r ON l.key = r.key AND l.fence = r.fence
   WHERE l.holder = $1 COLLATE "C" AND l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), released AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp(),
                               l.acquired_at + make_interval(secs => mine.min_hold),
                               l.acquired_at + interval '1 microsecond'),
         released_at = CASE WHEN mine.outcome = '` + givenBack + `' THEN NULL ELSE clock_timestamp() END
    FROM mine
   WHERE l.key = mine.key AND l.expires_at > clock_timestamp()
     AND set_config('synchronous_commit',
                    CASE WHEN EXISTS (SELECT 1 FROM r WHERE r.outcome IN ('completed', 'failed')) THEN ` + runFlush + `
                         ELSE 'off' END, true) IS NOT NULL
     AND set_config('lock_timeout', $5, true) IS NOT NULL
  RETURNING l.key, l.fence, mine.outcome`

// releaseRunReport is releaseReport after the runs are closed.
const releaseRunReport = `
), ran AS (
  UPDATE {runs} AS run SET ended_at = clock_timestamp(), outcome = released.outcome
    FROM released WHERE run.fence = released.fence AND released.outcome <> '' AND run.outcome IS NULL
)` + releaseSelect

// ReleaseOneRun is ReleaseOne closing the run of a lease of a tick ($6,
// its outcome).
const ReleaseOneRun = releaseOneRunRow + `
SELECT pg_notify({chanlit}, key) FROM released`

// ReleaseOneRunQuiet is ReleaseOneRun without the notification.
const ReleaseOneRunQuiet = releaseOneRunRow + `
SELECT key FROM released`

// releaseOneRunRow is releaseOneRow with its run closed.
const releaseOneRunRow = `WITH released AS (
UPDATE {table} AS l
   SET expires_at = GREATEST(clock_timestamp(),
                             l.acquired_at + make_interval(secs => $4),
                             l.acquired_at + interval '1 microsecond'),
       released_at = CASE WHEN $6::text = '` + givenBack + `' THEN NULL ELSE clock_timestamp() END
 WHERE l.key = $2 AND l.holder = $1 COLLATE "C" AND l.fence = $3
   AND l.expires_at > clock_timestamp()
   AND set_config('synchronous_commit',
                  CASE WHEN $6::text IN ('completed', 'failed') THEN ` + runFlush + ` ELSE 'off' END, true) IS NOT NULL
   AND set_config('lock_timeout', $5, true) IS NOT NULL
RETURNING l.key, l.fence
), ran AS (
  UPDATE {runs} AS run SET ended_at = clock_timestamp(), outcome = $6::text
    FROM released WHERE run.fence = released.fence AND run.outcome IS NULL
)`

// runFlush is the synchronous_commit of a release that closes a run: the
// session's when it waits for the flush at least (on, remote_write,
// remote_apply), on otherwise, as a claim raises it (raiseSyncCommit).
const runFlush = `CASE WHEN current_setting('synchronous_commit') IN ('on', 'remote_write', 'remote_apply')
                           THEN current_setting('synchronous_commit') ELSE 'on' END`

// givenBack is the outcome of a run whose claim was given back: it handed
// out no lease, and ran nothing.
const givenBack = "given back"
