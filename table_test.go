package pglease_test

import (
	"context"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestTable pins that a lease table works whatever its valid name and
// however it is partitioned.
func TestTable(t *testing.T) { //nolint:tparallel // NamedLikeAPartOfTheStatements runs alone: it creates tables of bare names in public
	// Guarantee: a lease table works whatever its (valid) name. The statements
	// name their own parts (WITH h, mine, extended, r, released, server,
	// instant, nearest, prev, taken, logged, closed, ran), and an
	// unqualified table of one of those names would be read as that part: the
	// release of a table named "r" failed with "column l.holder does not
	// exist". The bare names are refused with the way out; with its schema the
	// table works through claim, heartbeat, release and listing.
	t.Run("NamedLikeAPartOfTheStatements", func(t *testing.T) {
		ctx, pool, _ := pgtest.Setup(t)
		for _, name := range []string{"h", "mine", "extended", "r", "released", "server", "instant", "nearest", "prev", "taken", "logged", "closed", "ran"} {
			t.Run(name, func(t *testing.T) {
				err := pglease.Migrate(ctx, pool, pglease.WithTable(name))
				require.ErrorIs(t, err, pglease.ErrInvalidOption)
				require.ErrorContains(t, err, "give it with its schema (public."+name+")")

				qualified := "public." + name
				require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(qualified)))
				t.Cleanup(func() {
					_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS public.`+name+`; DROP SEQUENCE IF EXISTS public.`+name+`_fence_seq`)
				})
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, pool, qualified, "replica", pglease.WithTTL(time.Second),
					pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
				lease, err := l.Claim(ctx, "k")
				require.NoError(t, err)
				events.WaitFor(t, pglease.EventExtended, 5*time.Second)
				rows, err := adminOf(t, pool, pglease.WithTable(qualified)).List(ctx)
				require.NoError(t, err)
				require.Len(t, rows, 1)
				require.NoError(t, lease.Unlock(ctx))
				ticked, err := mustJob(t, l, pglease.WithPeriod(time.Hour)).Claim(ctx, "tick")
				require.NoError(t, err, "the claim of a tick")
				require.NoError(t, ticked.Unlock(ctx))
			})
		}
	})

	// Guarantee: Guard matches the table the claim wrote to. A user who
	// partitions the lease table by key (hash) gets the partition's oid from
	// the claim's RETURNING tableoid; Guard, the heartbeat and the release must
	// keep working on such a table, since a row never changes partition.
	t.Run("PartitionedByKey", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		name := pgtest.Name("lease_part")
		tbl, seq := pgx.Identifier{name}.Sanitize(), pgx.Identifier{name + "_fence_seq"}.Sanitize()
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE %[2]s AS bigint;
CREATE TABLE %[1]s (
    key text PRIMARY KEY, holder text NOT NULL,
    fence bigint NOT NULL DEFAULT nextval('%[2]s'),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL, tick timestamptz, released_at timestamptz,
    CHECK (expires_at > acquired_at)) PARTITION BY HASH (key);
CREATE TABLE %[3]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE %[4]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 1);`,
			tbl, seq, pgx.Identifier{name + "_p0"}.Sanitize(), pgx.Identifier{name + "_p1"}.Sanitize()))
		require.NoError(t, err)

		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, name, "p", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		for _, k := range []string{"a", "b", "c", "d"} {
			lease, err := l.Claim(ctx, k)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, lease.Guard(ctx, tx), "Guard on a partitioned table, key %s", k)
			require.NoError(t, tx.Rollback(ctx))
		}
		for range 3 {
			events.WaitFor(t, pglease.EventExtended, 2*time.Second)
		}
		require.Zero(t, events.Count(pglease.EventLost))
		require.NoError(t, l.Close(ctx))
		require.Equal(t, 4, events.Count(pglease.EventReleased))
	})

	// Guarantee: a Locker refuses, before anything is written, a table whose
	// fence sequence caches values (made from schema.sql by a migration tool
	// that adds CACHE): every entry point that draws a fence (a claim alone,
	// in a burst, Lock, ClaimWait, a job's Lock, an Elector) fails with
	// Migrate's error and its ALTER SEQUENCE, and no row or fence is
	// written; once the sequence is fixed, claims go through. Without the
	// check two replicas claiming one key in turn got fences [1 101 2].
	t.Run("RefusesAnUnorderedFenceSequenceAtFirstUse", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table, seq := fromSchemaSQL(t, pool)
		_, err := pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 100")
		require.NoError(t, err)
		const want = "caches 100 values per session"

		// Each replica on its own session, as pools keep them.
		replica := func(holder string) *pglease.Locker {
			conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return pgtest.Locker(t, conn, table, holder)
		}
		entries := map[string]func(l *pglease.Locker) error{
			"Claim": func(l *pglease.Locker) error { _, err := l.Claim(ctx, "job"); return err },
			"Lock":  func(l *pglease.Locker) error { _, err := l.Lock(ctx, "job"); return err },
			"ClaimWait": func(l *pglease.Locker) error {
				wctx, cancel := context.WithTimeout(ctx, 5*time.Second)
				defer cancel()
				_, err := l.ClaimWait(wctx, "job")
				return err
			},
			"JobLock": func(l *pglease.Locker) error {
				j, err := l.Job(pglease.WithTimeout(5 * time.Second))
				require.NoError(t, err)
				_, err = j.Lock(ctx, "job")
				return err
			},
			"Elector": func(l *pglease.Locker) error {
				e, err := pglease.NewElector(l, "leader")
				require.NoError(t, err)
				defer func() { _ = e.Close(ctx) }()
				return e.IsLeader(ctx)
			},
			"Burst": func(l *pglease.Locker) error {
				errs := make(chan error, 8)
				for i := range cap(errs) {
					go func() { _, err := l.Claim(ctx, fmt.Sprintf("job-%d", i)); errs <- err }()
				}
				var all []error
				for range cap(errs) {
					err := <-errs
					require.ErrorContains(t, err, want)
					all = append(all, err)
				}
				return all[0]
			},
		}
		for name, enter := range entries {
			for _, holder := range []string{"a", "b"} {
				err := enter(replica(holder))
				require.ErrorContains(t, err, "fence sequence "+seq+" "+want, name)
				require.ErrorContains(t, err, "ALTER SEQUENCE "+seq, name)
			}
		}
		var rows int
		var called bool
		require.NoError(t, pool.QueryRow(ctx, "SELECT (SELECT count(*) FROM "+pgx.Identifier{table}.Sanitize()+"), is_called FROM "+seq).Scan(&rows, &called))
		assert.Zero(t, rows, "rows written on a refused table")
		assert.False(t, called, "a fence drawn on a refused table")

		_, err = pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 1")
		require.NoError(t, err)
		a, b := replica("a"), replica("b")
		var fences []int64
		for _, l := range []*pglease.Locker{a, b, a} {
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err, "a claim once the sequence is fixed")
			fences = append(fences, lease.Fence())
			require.NoError(t, lease.Unlock(ctx))
		}
		assert.IsIncreasing(t, fences)
	})

	// Guarantee: a table whose key column has a nondeterministic collation
	// (case-insensitive ICU) is refused at a Locker's first claim, in both
	// fence modes, with an error that names the collation and the fix, and
	// nothing is written: under it "REPORT" claimed the row stored as
	// "Report", the heartbeat (whose arrays compare bytewise) lost that
	// lease at once, and a release matched another spelling's row.
	t.Run("RefusesACaseInsensitiveKeyAtFirstUse", func(t *testing.T) {
		t.Parallel()
		for _, fenced := range []bool{true, false} {
			t.Run(map[bool]string{true: "Fenced", false: "WithoutFenceColumn"}[fenced], func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				pool := pgtest.Pool(t, nil)
				coll := caseInsensitiveCollation(t, pool)
				var (
					table string
					db    pglease.DB = pool
					opts  []pglease.Option
				)
				if fenced {
					table, _ = fromSchemaSQL(t, pool, "key         text", "key         text COLLATE "+coll)
				} else {
					var dsn string
					table, dsn = legacyTable(t, strings.Replace(legacyColumns, "key text", "key text COLLATE "+coll, 1))
					db = pgtest.PoolAt(t, dsn, nil)
					opts = append(opts, pglease.WithoutFenceColumn())
				}
				quoted := pgx.Identifier{table}.Sanitize()
				_, err := pool.Exec(ctx, "INSERT INTO "+quoted+" (key, holder, expires_at, acquired_at) VALUES ('Report', 'x', clock_timestamp() - interval '1 second', clock_timestamp() - interval '2 seconds')")
				require.NoError(t, err)

				l := pgtest.Locker(t, db, table, "a", opts...)
				_, err = l.Claim(ctx, "REPORT")
				require.ErrorContains(t, err, "column key has the nondeterministic collation "+coll)
				t.Logf("claim: %v", err)
				var holder string
				require.NoError(t, pool.QueryRow(ctx, "SELECT string_agg(key || '=' || holder, ',') FROM "+quoted).Scan(&holder))
				assert.Equal(t, "Report=x", holder, "the refused claim wrote")

				fix := regexp.MustCompile(`ALTER TABLE [^)]+"C"`).FindString(err.Error())
				require.NotEmpty(t, fix, "the error says what to run: %v", err)
				_, err = pool.Exec(ctx, fix)
				require.NoError(t, err, fix)
				lease, err := l.Claim(ctx, "REPORT")
				require.NoError(t, err, "a claim once the collation is fixed")
				require.NoError(t, lease.Unlock(ctx))
			})
		}
	})

	// Guarantee: keys are compared byte for byte. A key column whose type
	// folds keys (citext ignores case, character(n) trailing spaces, name
	// cuts at 63 bytes) makes two keys share one row, as a
	// nondeterministic collation does: the Locker's first claim and
	// Migrate refuse it, naming the type and the fix, and write nothing.
	t.Run("RefusesAKeyTypeThatFoldsKeys", func(t *testing.T) {
		t.Parallel()
		for name, typ := range map[string]string{"citext": "citext", "char": "character(40)", "name": "name"} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				pool := pgtest.Pool(t, nil)
				if typ == "citext" {
					_, err := pool.Exec(ctx, "CREATE EXTENSION IF NOT EXISTS citext")
					require.NoError(t, err)
				}
				table, _ := fromSchemaSQL(t, pool, "key         text", "key         "+typ)
				quoted := pgx.Identifier{table}.Sanitize()
				l := pgtest.Locker(t, pool, table, "a")
				_, err := l.Claim(ctx, "job")
				require.ErrorContains(t, err, "column key is of type", "the first claim refuses it")
				require.ErrorContains(t, err, "ALTER TABLE "+quoted+" ALTER COLUMN key TYPE text")
				require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "column key is of type", "Migrate refuses it")
				var n int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+quoted).Scan(&n))
				assert.Zero(t, n, "a refused claim wrote")

				_, err = pool.Exec(ctx, "ALTER TABLE "+quoted+" ALTER COLUMN key TYPE text")
				require.NoError(t, err)
				lease, err := pgtest.Locker(t, pool, table, "b").Claim(ctx, "job")
				require.NoError(t, err, "a claim once the type is fixed")
				require.NoError(t, lease.Unlock(ctx))
			})
		}
	})

	// Guarantee: a sound table is never refused: a key column of a domain
	// over a domain over text compares keys byte for byte (the check
	// follows domains down to their base type).
	t.Run("AcceptsAKeyOfADomainOverADomainOverText", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		inner, outer := pgtest.Name("keytext"), pgtest.Name("keyname")
		_, err := pool.Exec(ctx, "CREATE DOMAIN "+inner+" AS text CHECK (VALUE <> ''); CREATE DOMAIN "+outer+" AS "+inner)
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP DOMAIN IF EXISTS "+outer+", "+inner+" CASCADE") })
		table, _ := fromSchemaSQL(t, pool, "key         text", "key         "+outer)
		lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		require.NoError(t, err, "a sound table was refused")
		require.NoError(t, lease.Unlock(ctx))
	})

	// Guarantee: keys are compared byte for byte. A unique index on key of
	// a nondeterministic collation, beside the primary key, is an arbiter
	// of the claim's ON CONFLICT (key): a claim of "REPORT" would take the
	// row of "Report". The first claim and Migrate refuse it, naming the
	// index, and write nothing.
	t.Run("RefusesAKeyIndexOfANondeterministicCollation", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		coll := caseInsensitiveCollation(t, pool)
		table, _ := fromSchemaSQL(t, pool)
		quoted := pgx.Identifier{table}.Sanitize()
		_, err := pool.Exec(ctx, "CREATE UNIQUE INDEX ON "+quoted+" (key COLLATE "+coll+")")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "INSERT INTO "+quoted+" (key, holder, expires_at, acquired_at) VALUES ('Report', 'x', clock_timestamp() - interval '1 second', clock_timestamp() - interval '2 seconds')")
		require.NoError(t, err)
		_, err = pgtest.Locker(t, pool, table, "a").Claim(ctx, "REPORT")
		require.ErrorContains(t, err, "on column key has the nondeterministic collation", "the first claim refuses it")
		require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "nondeterministic collation", "Migrate refuses it")
		var rows string
		require.NoError(t, pool.QueryRow(ctx, "SELECT string_agg(key || '=' || holder, ',') FROM "+quoted).Scan(&rows))
		assert.Equal(t, "Report=x", rows, "the refused claim wrote")
	})

	// Guarantee: fences of a key only grow. A fence default that draws from
	// the sequence through an expression (nextval(...) + 1000) gives new
	// rows fences that re-claims, drawing nextval itself, go back below:
	// only nextval of the sequence itself is accepted.
	t.Run("RefusesAFenceDefaultOtherThanNextvalOfTheSequence", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := fromSchemaSQLFenceDefault(t, pool, "DEFAULT ($1 + 1000)")
		_, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		require.ErrorContains(t, err, "column fence has a default other than nextval of", "the first claim refuses it")
		require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "column fence has a default other than nextval of", "Migrate refuses it")
	})

	// Guarantee: what a crash would empty is refused wherever it is: a
	// lease table partitioned by key whose partitions are UNLOGGED holds
	// its rows in them, and the first claim and Migrate refuse it, naming
	// the partition.
	t.Run("RefusesAnUnloggedPartitionAtFirstUse", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.TableName()
		tbl, seq := pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_fence_seq"}.Sanitize()
		part := pgx.Identifier{table + "_p1"}.Sanitize()
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE %[2]s AS bigint;
CREATE TABLE %[1]s (
    key text PRIMARY KEY, holder text NOT NULL,
    fence bigint NOT NULL DEFAULT nextval('%[2]s'),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL, tick timestamptz, released_at timestamptz,
    CHECK (expires_at > acquired_at)) PARTITION BY HASH (key);
CREATE TABLE %[3]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE UNLOGGED TABLE %[4]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 1);`,
			tbl, seq, pgx.Identifier{table + "_p0"}.Sanitize(), part))
		require.NoError(t, err)
		_, err = pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		// regclass's text: quoted only where it must be.
		require.ErrorContains(t, err, "partition "+table+"_p1 of "+tbl+" is UNLOGGED", "the first claim refuses it")
		require.ErrorContains(t, err, "ALTER TABLE "+table+"_p1 SET LOGGED")
		require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "UNLOGGED", "Migrate refuses it")
		var n int
		require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+tbl).Scan(&n))
		assert.Zero(t, n, "a refused claim wrote")
	})

	// Guarantee: a sound table is never refused. A fence sequence set
	// ahead of every fence with setval(seq, n, false), as after a restore,
	// shows no last value in the catalogs until its next nextval: it is
	// accepted, and the next fence is above every fence issued.
	t.Run("AcceptsASequenceSetAheadOfItsFences", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table, seq := fromSchemaSQL(t, pool)
		last := claimAndRelease(t, pgtest.Locker(t, pool, table, "before"), "job", 3)
		_, err := pool.Exec(ctx, "SELECT setval($1::regclass, $2, false)", seq, last+100)
		require.NoError(t, err)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "Migrate accepts it")
		lease, err := pgtest.Locker(t, pool, table, "after").Claim(ctx, "job")
		require.NoError(t, err, "a sequence whose next value (%d) is above every fence (%d) was refused", last+100, last)
		assert.GreaterOrEqual(t, lease.Fence(), last+100)
	})

	// Guarantee: no fence is issued twice. A Locker's first claim checks a
	// table made from schema.sql without Migrate (a migration tool), but
	// not its persistence: CREATE UNLOGGED SEQUENCE (PostgreSQL 15) passes,
	// a crash resets the sequence to its start, and the next claim of a key
	// is given a fence already issued to an earlier mandate of it. Migrate
	// refuses such a sequence (TestMigrate/RefusesWhatACrashWouldEmpty); the
	// Locker must refuse it at its first claim, or the fences must go on.
	t.Run("RefusesWhatACrashWouldEmptyAtFirstUse", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.CrashableServer(t)
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolAt(t, srv.DSN(), nil)
		table, _ := fromSchemaSQL(t, pool, "CREATE SEQUENCE", "CREATE UNLOGGED SEQUENCE")
		_, err := pool.Exec(ctx, "CHECKPOINT")
		require.NoError(t, err)

		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second))
		var maxFence int64
		for range 3 {
			lease, err := a.Claim(ctx, "job")
			if err != nil {
				require.ErrorContains(t, err, "UNLOGGED", "a refused claim names what a crash would empty")
				return
			}
			maxFence = max(maxFence, lease.Fence())
			require.NoError(t, lease.Unlock(ctx))
		}
		pgtest.CrashAndRestart(t, srv)
		pool.Close()
		_ = a.Close(ctx)

		after := pgtest.PoolAt(t, srv.DSN(), nil)
		b := pgtest.Locker(t, after, table, "b")
		// The release before the crash committed asynchronously and was
		// lost with it: b waits out a's TTL, then takes the key over.
		var lease *pglease.Lease
		require.Eventually(t, func() bool {
			lease, err = b.Claim(ctx, "job")
			return err == nil
		}, 10*time.Second, 50*time.Millisecond, "b takes job over once a's lease expired")
		require.Greater(t, lease.Fence(), maxFence, "the next mandate of job has a fence above every one issued to it before the crash (the unlogged fence sequence was accepted)")
	})

	// Guarantee: a fence is never issued twice or backwards. The check reads
	// the sequence named <table>_fence_seq, but a new row's fence comes from
	// the fence column's default, which a migration tool may draw from
	// another sequence (an identity column, as ORMs declare a bigint key
	// column): new rows then take fences from one sequence and re-claims
	// from the other, and a key's next mandate gets a smaller fence.
	t.Run("RefusesAFenceDefaultFromAnotherSequence", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := fromSchemaSQLFenceDefault(t, pool, "GENERATED BY DEFAULT AS IDENTITY")

		l := pgtest.Locker(t, pool, table, "a")
		var fences []int64
		for _, key := range []string{"k1", "k2", "k3", "job", "job"} {
			lease, err := l.Claim(ctx, key)
			if err != nil {
				require.ErrorContains(t, err, "fence", "a refused claim names the fence column's default")
				return
			}
			if key == "job" {
				fences = append(fences, lease.Fence())
			}
			require.NoError(t, lease.Unlock(ctx))
		}
		assert.IsIncreasing(t, fences, "fences of successive mandates of job")
	})

	// Guarantee: a fence is never issued backwards. A fence sequence behind
	// the fences its table already holds (restarted by a migration tool's
	// down-and-up, or restored from a dump taken before the rows) passes the
	// first claim's check, which reads only how the sequence counts, not
	// where it stands: a key's next mandate gets a smaller fence than the
	// row's.
	t.Run("RefusesASequenceBehindItsFences", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table, seq := fromSchemaSQL(t, pool)
		last := claimAndRelease(t, pgtest.Locker(t, pool, table, "before"), "job", 5)
		_, err := pool.Exec(ctx, "ALTER SEQUENCE "+seq+" RESTART")
		require.NoError(t, err)

		after := pgtest.Locker(t, pool, table, "after")
		lease, err := after.Claim(ctx, "job")
		if err != nil {
			require.ErrorContains(t, err, seq, "a refused claim names the sequence")
			return
		}
		assert.Greater(t, lease.Fence(), last, "a new Locker's first mandate of job has a fence above the row's previous one")
	})

	// Guarantee: a lease is handed out only once the server durably
	// confirmed it. A lease table made UNLOGGED by a migration tool (CREATE
	// UNLOGGED TABLE from schema.sql, without Migrate) passes the first
	// claim's check: a crash empties it, and another Locker claims the key
	// while the first still holds its acknowledged lease.
	t.Run("RefusesAnUnloggedTableAtFirstUse", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.CrashableServer(t)
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolAt(t, srv.DSN(), nil)
		table, _ := fromSchemaSQL(t, pool, "CREATE TABLE", "CREATE UNLOGGED TABLE")
		_, err := pool.Exec(ctx, "CHECKPOINT")
		require.NoError(t, err)

		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute))
		held, err := a.Claim(ctx, "job")
		if err != nil {
			require.ErrorContains(t, err, "UNLOGGED", "a refused claim names what a crash would empty")
			return
		}
		pgtest.CrashAndRestart(t, srv)

		after := pgtest.PoolAt(t, srv.DSN(), nil)
		b := pgtest.Locker(t, after, table, "b")
		_, err = b.Claim(ctx, "job")
		_, stillHeld := a.Held("job")
		require.ErrorIs(t, err, pglease.ErrHeld, "b claimed job after a crash while a's acknowledged lease (fence %d, held %v) had a minute to run", held.Fence(), stillHeld)
	})

	// Guarantee: a fence is never issued backwards, and a lease is handed
	// out only on a table a crash does not empty, even when the table or
	// its sequence changes under Lockers that already passed the check (a
	// restore from a dump, a migration tool's down-and-up): a claim after
	// the check's interval reads the catalogs again and is refused.
	t.Run("RefusesWhatChangedWhileLockersRun", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		for _, c := range []struct{ name, change, names string }{
			{"SequenceSetBack", "ALTER SEQUENCE %[2]s RESTART", "%[2]s"},
			{"TableMadeUnlogged", "ALTER TABLE %[1]s SET UNLOGGED", "UNLOGGED"},
		} {
			t.Run(c.name, func(t *testing.T) {
				table, seq := fromSchemaSQL(t, pool)
				named := func(format string) string {
					return strings.NewReplacer("%[1]s", pgx.Identifier{table}.Sanitize(), "%[2]s", seq).Replace(format)
				}
				l := pgtest.Locker(t, pool, table, "a")
				l.RecheckTableEvery(200 * time.Millisecond)
				claimAndRelease(t, l, "job", 3)
				_, err := pool.Exec(ctx, named(c.change))
				require.NoError(t, err)
				time.Sleep(300 * time.Millisecond) // past the interval of the check that passed
				_, err = l.Claim(ctx, "job")
				require.ErrorContains(t, err, named(c.names), "a claim after the interval reads the table again and is refused, naming what changed")
				_, held := l.Held("job")
				require.False(t, held)
			})
		}
	})

	// Guarantee: a fence never goes backwards. A table and sequence put
	// back to an earlier state under a running Locker (a dump restored, a
	// migration tool's down and up) are consistent with each other, and
	// pass the table's check; the Locker itself knows the greatest fence
	// its claims drew, and refuses a claim that draws one no greater.
	t.Run("RefusesAFenceDrawnBackwards", func(t *testing.T) {
		t.Parallel()
		for _, c := range []struct {
			name    string
			restore func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table, seq string, dump func())
		}{
			{"RestoredFromADump", func(_ context.Context, t *testing.T, _ *pgxpool.Pool, _, _ string, dump func()) {
				t.Helper()
				dump()
			}},
			{"DroppedAndMigratedAgain", func(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table, seq string, _ func()) {
				t.Helper()
				_, err := pool.Exec(ctx, fmt.Sprintf("DROP TABLE %s; DROP SEQUENCE %s", pgx.Identifier{table}.Sanitize(), seq))
				require.NoError(t, err)
				require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))
			}},
		} {
			t.Run(c.name, func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				tbl, seq := pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_fence_seq"}.Sanitize()
				l := pgtest.Locker(t, pool, table, "a")
				l.RecheckTableEvery(100 * time.Millisecond)
				claimAndRelease(t, l, "job", 1)
				// The dump: the table's rows and the sequence's last value.
				snap := pgtest.Name("snap")
				_, err := pool.Exec(ctx, fmt.Sprintf("CREATE TABLE %s AS SELECT * FROM %s", snap, tbl))
				require.NoError(t, err)
				var last int64
				require.NoError(t, pool.QueryRow(ctx, "SELECT last_value FROM "+seq).Scan(&last))
				issued := claimAndRelease(t, l, "job", 5)
				c.restore(ctx, t, pool, table, seq, func() {
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, "DELETE FROM "+tbl)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, fmt.Sprintf("INSERT INTO %s SELECT * FROM %s", tbl, snap))
					require.NoError(t, err)
					_, err = tx.Exec(ctx, "SELECT setval($1::regclass, $2)", seq, last)
					require.NoError(t, err)
					require.NoError(t, tx.Commit(ctx))
				})
				time.Sleep(300 * time.Millisecond) // past the interval of the check that passed
				lease, err := l.Claim(ctx, "job")
				require.ErrorContains(t, err, "the fence sequence went backwards", "fence %d issued before, the claim after the restore got %v", issued, lease)
				require.ErrorContains(t, err, seq, "the error names the sequence to set ahead")
				_, held := l.Held("job")
				require.False(t, held)
				row, ok := pgtest.ReadRow(t, pool, table, "job")
				require.True(t, ok)
				require.False(t, row.Live, "the row of the refused claim is given back")
			})
		}
	})

	// Guarantee: a Locker refuses only a claim that drew a fence no greater
	// than one drawn before: with the sequence untouched, claims of many
	// keys at once, bursts, re-entrant claims, Unlocks and claims whose
	// callers give up mid-statement (coalescer orphans) never see the
	// refusal.
	t.Run("NeverRefusesAFenceDrawnForward", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		lockers := []*pglease.Locker{
			pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(300*time.Millisecond)),
			pgtest.Locker(t, pool, table, "b", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(300*time.Millisecond)),
		}
		for _, l := range lockers {
			l.RecheckTableEvery(50 * time.Millisecond)
		}
		var (
			mu          sync.Mutex
			seen        []error
			won, failed int
		)
		deadline := time.Now().Add(4 * time.Second)
		var wg sync.WaitGroup
		// An outside transaction locks three keys' rows again and again, some
		// past the TTL: bursts fail on their lock wait and go alone, claims
		// expire while they wait (live = false).
		wg.Go(func() {
			for i := 0; time.Now().Before(deadline); i++ {
				tx, err := pool.Begin(ctx)
				if err != nil {
					return
				}
				_, _ = tx.Exec(ctx, "SELECT 1 FROM "+pgx.Identifier{table}.Sanitize()+" WHERE key IN ('k0', 'k1', 'k2') FOR UPDATE")
				time.Sleep(time.Duration(100+(i*370)%1200) * time.Millisecond)
				_ = tx.Rollback(ctx)
				time.Sleep(20 * time.Millisecond)
			}
		})
		for w := range 16 {
			wg.Go(func() {
				l := lockers[w%2]
				for i := 0; time.Now().Before(deadline); i++ {
					key := fmt.Sprintf("k%d", (w*7+i)%12)
					cctx, cancel := context.WithCancel(ctx)
					if i%5 == 0 {
						// give up mid-statement: an orphan of the coalescer
						go func() { time.Sleep(time.Duration(i%3) * time.Millisecond); cancel() }()
					}
					lease, err := l.Claim(cctx, key)
					if err != nil && strings.Contains(err.Error(), "went backwards") {
						mu.Lock()
						seen = append(seen, err)
						mu.Unlock()
					}
					mu.Lock()
					if err == nil {
						won++
					} else {
						failed++
					}
					mu.Unlock()
					if err == nil && i%3 != 0 {
						_ = lease.Unlock(ctx)
					}
					cancel()
				}
			})
		}
		wg.Wait()
		t.Logf("%d claims won, %d failed", won, failed)
		require.Positive(t, won)
		require.Empty(t, seen, "claims refused as drawing backwards with the sequence untouched")
	})

	// Guarantee: a fence never goes backwards, on every claim path, even
	// for a claim that passed the table's check and then waited on its
	// row's lock while the sequence was set back.
	t.Run("RefusesAFenceDrawnBackwardsAfterAWaitOnTheRow", func(t *testing.T) {
		t.Parallel()
		for _, path := range []struct {
			name  string
			claim func(ctx context.Context, l *pglease.Locker) (int64, error)
		}{
			{"Claim", func(ctx context.Context, l *pglease.Locker) (int64, error) {
				lease, err := l.Claim(ctx, "job")
				if err != nil {
					return 0, err
				}
				return lease.Fence(), nil
			}},
			{"Lock", func(ctx context.Context, l *pglease.Locker) (int64, error) {
				if _, err := l.Lock(ctx, "job"); err != nil {
					return 0, err
				}
				lease, _ := l.Held("job")
				return lease.Fence(), nil
			}},
			{"JobLock", func(ctx context.Context, l *pglease.Locker) (int64, error) {
				j, err := l.Job(pglease.WithTimeout(20 * time.Second))
				if err != nil {
					return 0, err
				}
				if _, err := j.Lock(ctx, "job"); err != nil {
					return 0, err
				}
				lease, _ := l.Held("job")
				return lease.Fence(), nil
			}},
			{"ClaimWait", func(ctx context.Context, l *pglease.Locker) (int64, error) {
				lease, err := l.ClaimWait(ctx, "job")
				if err != nil {
					return 0, err
				}
				return lease.Fence(), nil
			}},
			{"ElectorCampaign", func(ctx context.Context, l *pglease.Locker) (int64, error) {
				e, err := pglease.NewElector(l, "job")
				if err != nil {
					return 0, err
				}
				lease, err := e.Campaign(ctx)
				if err != nil {
					return 0, err
				}
				return lease.Fence(), nil
			}},
		} {
			t.Run(path.name, func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				seq := pgx.Identifier{table + "_fence_seq"}.Sanitize()
				l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(20*time.Second))
				l.RecheckTableEvery(100 * time.Millisecond)
				// Fences far above 1: a claim sent again after each lock
				// wait (lib/pq) draws a discarded value each time.
				_, err := pool.Exec(ctx, "SELECT setval($1::regclass, 1000)", seq)
				require.NoError(t, err)
				issued := claimAndRelease(t, l, "job", 5)

				end := pgtest.LockRow(t, pool, table, "job")
				type result struct {
					fence int64
					err   error
				}
				waiting := make(chan result, 1)
				go func() { f, err := path.claim(ctx, l); waiting <- result{f, err} }()
				pgtest.LockWaiter(t, pool, "", table, 5*time.Second)
				_, err = pool.Exec(ctx, "SELECT setval($1::regclass, 1)", seq)
				require.NoError(t, err)
				time.Sleep(300 * time.Millisecond) // past the interval
				_, err = l.Claim(ctx, "other")
				require.Error(t, err, "the re-check refuses the sequence set back")
				time.Sleep(300 * time.Millisecond)
				end(false)

				got := <-waiting
				if got.err == nil {
					require.Greater(t, got.fence, issued, "a claim that waited on its row while the sequence was set back drew fence %d below %d", got.fence, issued)
				}
			})
		}
	})

	// Guarantee: a lease is handed out once. An expiry column of another
	// type than a timestamptz of full precision (an ORM's or a migration
	// tool's schema.sql) is refused, by Migrate and by a Locker, and
	// when a column is changed so under running Lockers, within the
	// check's interval: a timestamp without time zone is read in each
	// session's time zone (a replica ahead sees a live lease expired),
	// timestamptz(0) rounds an expiry past a short lease's trust margin.
	t.Run("RefusesAnExpiryOtherThanTimestamptz", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		for _, c := range []struct{ name, typ, names string }{
			{"WithoutTimeZone", "timestamp", "expires_at timestamp without time zone"},
			{"RoundedToTheSecond", "timestamptz(0)", "expires_at timestamp(0) with time zone"},
		} {
			t.Run(c.name, func(t *testing.T) {
				table, _ := fromSchemaSQL(t, pool, "timestamptz", c.typ)
				l := pgtest.Locker(t, pool, table, "a")
				_, err := l.Claim(ctx, "job")
				require.ErrorContains(t, err, c.names)
				require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), c.names)
				_, ok := pgtest.ReadRow(t, pool, table, "job")
				require.False(t, ok, "nothing is written")
			})
		}
		t.Run("ChangedUnderRunningLockers", func(t *testing.T) {
			table, dsn := legacyTable(t, legacyColumns)
			l := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "a", pglease.WithoutFenceColumn())
			l.RecheckTableEvery(100 * time.Millisecond)
			claimAndRelease(t, l, "job", 1)
			_, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ALTER COLUMN expires_at TYPE timestamp USING expires_at AT TIME ZONE 'UTC'`, pgx.Identifier{table}.Sanitize()))
			require.NoError(t, err)
			time.Sleep(300 * time.Millisecond) // past the interval of the check that passed
			_, err = l.Claim(ctx, "job")
			require.ErrorContains(t, err, "expires_at timestamp without time zone")
		})
	})

	// Guarantee: a sound table is never refused. An expiry column of a
	// domain over timestamptz holds timestamptz values of full precision,
	// as the key check follows domains to their base type; such a table
	// worked before the expiry check and must keep working.
	t.Run("AcceptsAnExpiryOfADomainOverTimestamptz", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		dom := pgtest.Name("expiry")
		_, err := pool.Exec(ctx, "CREATE DOMAIN "+dom+" AS timestamptz")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP DOMAIN IF EXISTS "+dom+" CASCADE") })
		t.Run("Fenced", func(t *testing.T) {
			table, _ := fromSchemaSQL(t, pool, "timestamptz", dom)
			lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
			require.NoError(t, err, "a sound table (expiry of a domain over timestamptz) was refused")
			require.NoError(t, lease.Unlock(ctx))
			require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "Migrate refuses it")
		})
		t.Run("WithoutFenceColumn", func(t *testing.T) {
			table, dsn := legacyTable(t, `key text PRIMARY KEY, holder text NOT NULL, expires_at `+dom+` NOT NULL, acquired_at `+dom)
			l := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "a", pglease.WithoutFenceColumn())
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err, "a legacy table (expiry of a domain over timestamptz) was refused")
			require.NoError(t, lease.Unlock(ctx))
		})
	})

	// Guarantee: a lease is handed out once. A domain over timestamptz(0)
	// rounds expiries to the second as timestamptz(0) does (the column's
	// own typmod is -1: the precision is the domain's): refused. Holds
	// today; a fix that follows domains must keep it.
	t.Run("RefusesAnExpiryOfADomainOverTimestamptz0", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		dom := pgtest.Name("expiry0")
		_, err := pool.Exec(ctx, "CREATE DOMAIN "+dom+" AS timestamptz(0)")
		require.NoError(t, err)
		t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP DOMAIN IF EXISTS "+dom+" CASCADE") })
		table, _ := fromSchemaSQL(t, pool, "timestamptz", dom)
		_, err = pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		require.ErrorContains(t, err, "expires_at", "a domain over timestamptz(0) is refused")
		_, ok := pgtest.ReadRow(t, pool, table, "job")
		require.False(t, ok, "nothing is written")
	})

	// Guarantee: a sound table is never refused. timestamptz(6) is a
	// timestamptz of full precision (the table check accepts typmod 6), in
	// both fence modes.
	t.Run("AcceptsAnExpiryOfTimestamptz6", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		t.Run("Fenced", func(t *testing.T) {
			pool := pgtest.Pool(t, nil)
			table, _ := fromSchemaSQL(t, pool, "timestamptz", "timestamptz(6)")
			lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
			require.NoError(t, err, "a table with timestamptz(6) expiries was refused")
			require.NoError(t, lease.Unlock(ctx))
		})
		t.Run("WithoutFenceColumn", func(t *testing.T) {
			table, dsn := legacyTable(t, `key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz(6) NOT NULL, acquired_at timestamptz(6)`)
			l := pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "a", pglease.WithoutFenceColumn())
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err, "a legacy table with timestamptz(6) expiries was refused")
			require.NoError(t, lease.Unlock(ctx))
		})
	})

	// Guarantee: the check of the table costs one read per Locker and
	// interval, however many claims, bursts and re-claims follow, and none
	// on the heartbeat, release or Guard.
	t.Run("CheckedOncePerLockerAndInterval", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		counter.Reset()
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		l.RecheckTableEvery(time.Hour) // the test's claims all fall within one interval, however slow the machine
		errs := make(chan error, 16)
		for i := range cap(errs) {
			go func() { _, err := l.Claim(ctx, fmt.Sprintf("job-%d", i)); errs <- err }()
		}
		for range cap(errs) {
			require.NoError(t, <-errs)
		}
		for range 5 {
			lease, err := l.Claim(ctx, "job")
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, lease.Guard(ctx, tx))
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, lease.Unlock(ctx))
		}
		// One check: the catalog read, then the read of the fences against
		// the sequence.
		const reads = 2
		assert.Equal(t, reads, counter.Count("tablecheck"), "reads of the table by one Locker")

		other := pgtest.Locker(t, pool, table, "b")
		_, err := other.Claim(ctx, "another")
		require.NoError(t, err)
		assert.Equal(t, 2*reads, counter.Count("tablecheck"), "one check per Locker")

		// Past the interval, one more check, then none again.
		l.RecheckTableEvery(0)
		lease, err := l.Claim(ctx, "again")
		require.NoError(t, err)
		assert.Equal(t, 3*reads, counter.Count("tablecheck"), "a claim past the interval checks again")
		require.NoError(t, lease.Unlock(ctx))
	})
}

// fromSchemaSQL creates a lease table as a migration tool would, from
// Schema's DDL (each replace pair applied to it), without Migrate, and
// returns its name and its sequence's quoted name.
func fromSchemaSQL(t *testing.T, pool *pgxpool.Pool, replace ...string) (table, seq string) {
	t.Helper()
	return fromEditedSchemaSQL(t, pool, strings.NewReplacer(replace...).Replace)
}

// fromSchemaSQLFenceDefault is fromSchemaSQL with the fence column's
// DEFAULT nextval(...) declared as def instead ($1 in def is that nextval
// call), and returns the table's name.
func fromSchemaSQLFenceDefault(t *testing.T, pool *pgxpool.Pool, def string) (table string) {
	t.Helper()
	table, _ = fromEditedSchemaSQL(t, pool, func(ddl string) string {
		edited := regexp.MustCompile(`DEFAULT (nextval\('[^']*'\))`).ReplaceAllString(ddl, def)
		require.NotEqual(t, ddl, edited, "Schema's DDL has a fence default of nextval to replace")
		return edited
	})
	return table
}

// fromEditedSchemaSQL is fromSchemaSQL with Schema's DDL passed through
// edit.
func fromEditedSchemaSQL(t *testing.T, pool *pgxpool.Pool, edit func(ddl string) string) (table, seq string) {
	t.Helper()
	table = pgtest.TableName()
	ddl, err := pglease.Schema(pglease.WithTable(table))
	require.NoError(t, err)
	_, err = pool.Exec(pgtest.Ctx(t), edit(ddl))
	require.NoError(t, err)
	return table, pgx.Identifier{table + "_fence_seq"}.Sanitize()
}

// claimAndRelease claims key n times with l, releasing each lease, and
// returns the last fence issued.
func claimAndRelease(t *testing.T, l *pglease.Locker, key string, n int) (last int64) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	for range n {
		lease, err := l.Claim(ctx, key)
		require.NoError(t, err)
		last = lease.Fence()
		require.NoError(t, lease.Unlock(ctx))
	}
	return last
}

// caseInsensitiveCollation creates an ICU collation that compares keys
// case-insensitively (nondeterministic), dropped at cleanup, and returns
// its name.
func caseInsensitiveCollation(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := pgtest.Name("ci")
	_, err := pool.Exec(pgtest.Ctx(t), "CREATE COLLATION "+name+" (provider = icu, locale = 'und-u-ks-level2', deterministic = false)")
	require.NoError(t, err)
	t.Cleanup(func() { _, _ = pool.Exec(context.Background(), "DROP COLLATION IF EXISTS "+name+" CASCADE") })
	return name
}
