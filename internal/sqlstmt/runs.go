package sqlstmt

import "github.com/jackc/pgx/v5"

// The ledger of runs: one row per claim of a job's tick (ClaimTick), beside
// the lease table, written by the claims themselves so that it costs no
// round trip. A run's end is written by the next claim of its job's tick
// (ClaimTick closes the run whose row it takes over); until then Runs reads
// it from the lease row, which still carries the run's fence.

// RunsSuffix names the ledger of runs, beside its lease table.
const RunsSuffix = "_run"

// Runs is the ledger of the runs of table (one part, or schema and name):
// beside it, named after it.
func Runs(table pgx.Identifier) pgx.Identifier {
	runs := append(pgx.Identifier{}, table...)
	runs[len(runs)-1] += RunsSuffix
	return runs
}

// CreateRuns makes the ledger. One row per run, keyed by its fence (a
// fence is drawn once per claim), with the job's key and tick, the holder
// that ran it and the server's time of its claim. ended_at and outcome
// stay NULL until the next claim of the job's tick closes the run:
// completed (released by its holder), failed (released, its task having
// returned an error: the release writes it), lapsed (expired without a release:
// its holder died or was paused past its TTL), revoked (`pglease release`),
// superseded (its own holder claimed the next tick while it ran), and
// skipped for a tick whose claims found the run of an earlier tick still
// holding the key: a row of that run's fence and the skipped tick, so
// that the replicas' claims that found it so enter it once (the key is
// fence and tick). The index serves the listing of one job's recent runs.
const CreateRuns = `CREATE TABLE IF NOT EXISTS {runs} (
    fence      bigint      NOT NULL,
    key        text        NOT NULL,
    tick       timestamptz NOT NULL,
    holder     text        NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    outcome    text,
    PRIMARY KEY (fence, tick)
)`

// CreateRunsIndex indexes the ledger by job and start.
const CreateRunsIndex = `CREATE INDEX IF NOT EXISTS {runsindex} ON {runs} (key, started_at)`

// ListRuns lists the runs of one job ($1, or every job when NULL) started
// within $2 seconds of the server's clock, with the outcome of each: the
// one the next claim wrote, or for a run not yet closed, what the lease row
// says while it still carries the run's fence (revoked, completed when
// released, though a min hold keeps it live, running while live, lapsed
// when expired without a release), and
// unknown when a claim outside the job's ticks took the row. A tick
// skipped by one replica and run by another (their clocks apart) is listed
// as the run alone, unless that run was given back (it ran nothing).
// Sorted by key byte-wise, then by tick.
const ListRuns = `WITH server AS (SELECT clock_timestamp() AS now)
SELECT r.key, r.tick, r.fence, r.holder, r.started_at,
       coalesce(r.ended_at, CASE WHEN l.fence = r.fence AND l.released_at IS NOT NULL THEN l.released_at
                                 WHEN l.fence = r.fence AND l.expires_at <= server.now THEN l.expires_at END),
       coalesce(r.outcome, CASE WHEN l.fence IS DISTINCT FROM r.fence THEN 'unknown'
                                WHEN l.holder = '` + RevokedHolder + `' THEN 'revoked'
                                WHEN l.released_at IS NOT NULL THEN 'completed'
                                WHEN l.expires_at > server.now THEN 'running'
                                ELSE 'lapsed' END),
       server.now
  FROM server, {runs} AS r LEFT JOIN {table} AS l ON l.key = r.key
 WHERE ($1::text IS NULL OR r.key = $1::text)
   AND r.started_at >= server.now - make_interval(secs => $2)
   AND (r.outcome IS DISTINCT FROM 'skipped'
        OR NOT EXISTS (SELECT 1 FROM {runs} AS ran WHERE ran.key = r.key AND ran.tick = r.tick
                          AND ran.outcome IS DISTINCT FROM 'skipped' AND ran.outcome IS DISTINCT FROM '` + givenBack + `'))
 ORDER BY r.key COLLATE "C", r.tick, r.fence`

// PurgeRuns deletes the runs started longer than the retention ($1, in
// seconds) ago, as Purge deletes long expired lease rows, but for the run
// whose fence its lease row still carries: its end is not written yet (a
// long job's, or a lapse nothing followed), and the catch-up of a lapsed
// run needs it. A run is history: deleting it changes no lease.
const PurgeRuns = `DELETE FROM {runs} AS run WHERE started_at < clock_timestamp() - make_interval(secs => $1)
   AND NOT EXISTS (SELECT 1 FROM {table} AS l WHERE l.key = run.key AND l.fence = run.fence)`

// HasRuns reports whether the ledger ($1, its quoted name) exists: Purge
// (pglease purge) runs on tables made before it, and WithoutFenceColumn.
const HasRuns = `SELECT to_regclass($1) IS NOT NULL`
