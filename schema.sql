-- pglease schema, for migration tools (goose, golang-migrate, atlas...).
--
-- This is exactly the DDL that pglease.Migrate runs for the default table
-- name "lease" (a test fails if the two drift apart). Paste it into a
-- migration when the service's role may not run DDL, and give that role
-- only what it needs at run time:
--
--   GRANT SELECT, INSERT, UPDATE ON lease, lease_run TO app;
--   GRANT USAGE ON SEQUENCE lease_fence_seq TO app;
--
-- lease_run is the ledger of the runs of jobs with ticks (WithPeriod),
-- written by their claims.
--
-- For another table name, print the DDL with pglease.Schema(WithTable(...)):
-- the sequence must be named "<table>_fence_seq", beside the table.
-- Do not add an index on expires_at: without one every update is a HOT
-- update and the table stays a few pages forever.
-- Keep the sequence as created: INCREMENT BY 1, CACHE 1, NO CYCLE, the
-- bigint maximum. With CACHE n each session draws its own block of n
-- values, and a later lease of a key could get a smaller fence (1, n+1,
-- 2). Migrate refuses such a sequence, saying what to run, and so does a
-- Locker's first claim. To check it yourself, this must return
-- 1 | 9223372036854775807 | 1 | f
--   SELECT seqincrement, seqmax, seqcache, seqcycle FROM pg_sequence
--    WHERE seqrelid = 'lease_fence_seq'::regclass;
-- Keep key's collation deterministic (the default): a case-insensitive one
-- would make "Report" and "REPORT" one row, and is refused likewise.
-- Expired rows are purged by Migrate; without it, run
-- `pglease purge -older-than 24h` (cmd/pglease) from a scheduled job.
CREATE SEQUENCE IF NOT EXISTS "lease_fence_seq" AS bigint;
CREATE TABLE IF NOT EXISTS "lease" (
    key         text        PRIMARY KEY,
    holder      text        NOT NULL,
    fence       bigint      NOT NULL DEFAULT nextval('"lease_fence_seq"'),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at  timestamptz NOT NULL,
    tick        timestamptz,
    released_at timestamptz,
    CHECK (expires_at > acquired_at)
);
CREATE TABLE IF NOT EXISTS "lease_run" (
    fence      bigint      NOT NULL,
    key        text        NOT NULL,
    tick       timestamptz NOT NULL,
    holder     text        NOT NULL,
    started_at timestamptz NOT NULL,
    ended_at   timestamptz,
    outcome    text,
    PRIMARY KEY (fence, tick)
);
CREATE INDEX IF NOT EXISTS "lease_run_key" ON "lease_run" (key, started_at);
