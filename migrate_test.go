package pglease_test

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// stripComments drops the leading "--" comment block of schema.sql.
func stripComments(sql string) string {
	lines := strings.SplitAfter(sql, "\n")
	i := 0
	for i < len(lines) && strings.HasPrefix(lines[i], "--") {
		i++
	}
	return strings.Join(lines[i:], "")
}

// TestMigrate pins Migrate: it creates the table and the sequence
// idempotently and safely at once from many replicas, purges only what is
// expired past the retention without sending a fence backwards, and
// refuses relations that could issue fences out of order or lose leases.
func TestMigrate(t *testing.T) {
	t.Parallel()
	// Guarantee: Migrate creates the table and the sequence, idempotently, under
	// any table name.
	t.Run("IdempotentUnderAnyTableName", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		schema := pgtest.Name("s_migrate")
		_, err := pool.Exec(ctx, "CREATE SCHEMA "+schema)
		require.NoError(t, err)

		for _, name := range []string{pgtest.Name("other"), schema + ".other", pgtest.Name("Mixed_Case$")} {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				for range 3 {
					require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(name)))
				}
				parts := strings.Split(name, ".")
				seq := append([]string{}, parts...)
				seq[len(seq)-1] += "_fence_seq"
				var tbl, sq *string
				require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1)::text, to_regclass($2)::text`,
					pgx.Identifier(parts).Sanitize(), pgx.Identifier(seq).Sanitize()).Scan(&tbl, &sq))
				require.NotNil(t, tbl, "table %s exists", name)
				require.NotNil(t, sq, "sequence of %s exists", name)

				l := pgtest.Locker(t, pool, name, "h")
				lease, err := l.Claim(ctx, "k")
				require.NoError(t, err)
				var seqValue int64
				require.NoError(t, pool.QueryRow(ctx, "SELECT last_value FROM "+pgx.Identifier(seq).Sanitize()).Scan(&seqValue))
				assert.Equal(t, seqValue, lease.Fence(), "the fence comes from the table's own sequence")
			})
		}
	})

	// Guarantee: Migrate is safe when ten replicas run it at once.
	t.Run("TenReplicasAtOnce", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		name := pgtest.TableName()
		var wg sync.WaitGroup
		errs := make([]error, 10)
		for i := range errs {
			wg.Go(func() {
				conn, err := pgx.Connect(ctx, pgtest.Server.DSN()) // a replica of its own
				if err != nil {
					errs[i] = err
					return
				}
				defer conn.Close(context.Background())
				errs[i] = pglease.Migrate(ctx, conn, pglease.WithTable(name))
			})
		}
		wg.Wait()
		for i, err := range errs {
			require.NoError(t, err, "replica %d", i)
		}
		l := pgtest.Locker(t, pool, name, "h")
		_, err := l.Claim(ctx, "k")
		require.NoError(t, err)
	})

	// Guarantee: Migrate purges only rows expired longer than the retention.
	t.Run("PurgesOnlyPastTheRetention", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ins := fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at) VALUES ($1, 'h', clock_timestamp() - $2::interval - interval '1 minute', clock_timestamp() - $2::interval)`,
			pgx.Identifier{table}.Sanitize())
		for key, ago := range map[string]string{"old": "2 hours", "recent": "10 minutes", "live": "-1 hour"} {
			_, err := pool.Exec(ctx, ins, key, ago)
			require.NoError(t, err)
		}
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(time.Hour)))
		_, ok := pgtest.ReadRow(t, pool, table, "old")
		assert.False(t, ok, "expired two hours ago, retention one hour: purged")
		_, ok = pgtest.ReadRow(t, pool, table, "recent")
		assert.True(t, ok, "expired ten minutes ago: kept")
		_, ok = pgtest.ReadRow(t, pool, table, "live")
		assert.True(t, ok, "live: kept")

		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))
		_, ok = pgtest.ReadRow(t, pool, table, "recent")
		assert.True(t, ok, "the default retention (24h) keeps it")
	})

	// Claim Y draws its fence and stalls; claim X takes the key with a greater
	// fence and releases it; a purge at the shortest horizon pglease accepts
	// runs; Y goes on. With a horizon of 0 the purge deleted X's row and Y
	// inserted the key with its smaller fence. The horizon floor keeps X's row,
	// so Y meets it and takes a fresh, greater fence.
	t.Run("PurgeNeverSendsAFenceBackwards", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		resume := stallClaims(t, table, "y")
		y := pgtest.Locker(t, pool, table, "y")
		x := pgtest.Locker(t, pool, table, "x")

		type result struct {
			lease *pglease.Lease
			err   error
		}
		yDone := make(chan result, 1)
		go func() {
			lease, err := y.Claim(ctx, "k")
			yDone <- result{lease, err}
		}()
		waitStalled(t, pool, table)

		xLease, err := x.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, xLease.Unlock(ctx))

		// The shortest purge horizon pglease accepts.
		if err := pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(0)); err != nil {
			require.ErrorContains(t, err, "at least 1h0m0s", "a horizon of 0 is refused, saying why")
			require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(time.Hour)))
		}

		resume()
		var got result
		select {
		case got = <-yDone:
		case <-time.After(10 * time.Second):
			t.Fatal("the stalled claim never returned")
		}
		require.NoError(t, got.err, "X's lease was released: Y takes the key")
		require.Greater(t, got.lease.Fence(), xLease.Fence(),
			"Y's fence after X's: the fence went backwards across the purge")
		row, ok := pgtest.ReadRow(t, pool, table, "k")
		require.True(t, ok)
		require.Equal(t, got.lease.Fence(), row.Fence)
	})

	// No purge pglease runs deletes a row expired less than MinRetention ago,
	// whatever horizon it is asked for.
	t.Run("RefusesAHorizonBelowMinRetention", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ins := fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at) VALUES ($1, 'h', clock_timestamp() - $2::interval - interval '1 minute', clock_timestamp() - $2::interval)`,
			pgx.Identifier{table}.Sanitize())
		for key, ago := range map[string]string{"just-expired": "1 second", "expired-59m": "59 minutes", "expired-61m": "61 minutes"} {
			_, err := pool.Exec(ctx, ins, key, ago)
			require.NoError(t, err)
		}
		for _, d := range []time.Duration{0, time.Nanosecond, time.Minute, time.Hour - time.Microsecond} {
			err := pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(d))
			require.ErrorContains(t, err, "must be at least 1h0m0s", "WithRetention(%v)", d)
			require.ErrorContains(t, err, "a claim draws its fence before it inserts its row", "the refusal says why")
		}
		for _, key := range []string{"just-expired", "expired-59m", "expired-61m"} {
			_, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok, "%s: a refused Migrate purges nothing", key)
		}
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(time.Hour)))
		for key, kept := range map[string]bool{"just-expired": true, "expired-59m": true, "expired-61m": false} {
			_, ok := pgtest.ReadRow(t, pool, table, key)
			require.Equal(t, kept, ok, "%s kept after a purge at MinRetention", key)
		}
	})

	// A fence sequence tuned away from what Migrate creates hands out fences
	// that do not always grow: with CACHE n each session draws its own block of
	// n values, so successive mandates of one key get 1, n+1, 2...; CYCLE, a
	// reachable MAXVALUE (AS integer included) or an INCREMENT other than 1 break
	// the order or end it. Migrate, which runs at every deploy, refuses such a
	// sequence (and a relation of its name that is no sequence at all), saying
	// exactly what to run, and accepts it once that has run.
	t.Run("RefusesAnUnorderedFenceSequence", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		fix := regexp.MustCompile(`ALTER SEQUENCE [^;)]+`)
		for _, c := range []struct{ alter, want string }{
			{"CACHE 100", "caches 100 values per session"},
			{"CYCLE", "cycles"},
			{"MAXVALUE 1000000", "stops at 1000000"},
			{"AS integer", "stops at 2147483647"},
			{"INCREMENT BY 2", "increments by 2"},
			{"INCREMENT BY -1", "increments by -1"},
		} {
			t.Run(c.alter, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				table := pgtest.Table(t, pool)
				seq := pgx.Identifier{table + "_fence_seq"}.Sanitize()
				_, err := pool.Exec(ctx, "ALTER SEQUENCE "+seq+" "+c.alter)
				require.NoError(t, err)

				err = pglease.Migrate(ctx, pool, pglease.WithTable(table))
				require.ErrorContains(t, err, "fence sequence "+seq+" "+c.want)
				run := fix.FindString(err.Error())
				require.NotEmpty(t, run, "the error says what to run: %v", err)
				assert.Contains(t, run, "ALTER SEQUENCE "+seq)
				_, err = pool.Exec(ctx, run)
				require.NoError(t, err, "what the error says to run runs: %s", run)
				require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "accepted once fixed by %s", run)
			})
		}

		t.Run("CacheTurnsFencesBack", func(t *testing.T) {
			// Why CACHE is refused: two sessions drawing a key's fences in
			// turn (a Locker refuses such a sequence too, at its first claim:
			// TestTable/RefusesAnUnorderedFenceSequenceAtFirstUse).
			t.Parallel()
			ctx := pgtest.Ctx(t)
			table := pgtest.Table(t, pool)
			seq := pgx.Identifier{table + "_fence_seq"}.Sanitize()
			_, err := pool.Exec(ctx, "ALTER SEQUENCE "+seq+" CACHE 100")
			require.NoError(t, err)
			// Each replica keeps its session, as a pool does: the first draws
			// a block of 100 values, the second the next block.
			var sessions []*pgx.Conn
			for range 2 {
				conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
				require.NoError(t, err)
				t.Cleanup(func() { _ = conn.Close(context.Background()) })
				sessions = append(sessions, conn)
			}
			var fences []int64
			for _, conn := range []*pgx.Conn{sessions[0], sessions[1], sessions[0]} {
				var fence int64
				require.NoError(t, conn.QueryRow(ctx, "SELECT nextval('"+seq+"')").Scan(&fence))
				fences = append(fences, fence)
			}
			assert.Less(t, fences[2], fences[1], "a cached sequence issued fences %v: the third mandate's is below the second's", fences)
			require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "caches 100 values per session")
		})

		t.Run("NotASequence", func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			table := pgtest.TableName()
			_, err := pool.Exec(ctx, "CREATE TABLE "+pgx.Identifier{table + "_fence_seq"}.Sanitize()+" (x int)")
			require.NoError(t, err)
			err = pglease.Migrate(ctx, pool, pglease.WithTable(table))
			require.ErrorContains(t, err, "is not a sequence")
		})
	})

	// Guarantee: Migrate refuses an existing table whose key column has a
	// nondeterministic (case-insensitive) collation, naming the collation and
	// the statement that fixes it, and accepts the table once it is run.
	t.Run("RefusesACaseInsensitiveKeyCollation", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		coll := caseInsensitiveCollation(t, pool)
		table, _ := fromSchemaSQL(t, pool, "key         text", "key         text COLLATE "+coll)

		err := pglease.Migrate(ctx, pool, pglease.WithTable(table))
		require.ErrorContains(t, err, "column key has the nondeterministic collation "+coll)
		fix := regexp.MustCompile(`ALTER TABLE [^)]+"C"`).FindString(err.Error())
		require.NotEmpty(t, fix, "the error says what to run: %v", err)
		_, err = pool.Exec(ctx, fix)
		require.NoError(t, err, fix)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "accepted once fixed by %s", fix)
	})

	// Guarantee: Migrate refuses a fence sequence that could hand a later
	// lease of a key a smaller fence. A new row's fence comes from the fence
	// column's default, a re-claim's from <table>_fence_seq: a table whose
	// fence default draws from another sequence (an identity column) passes
	// Migrate, and a key's next lease gets a smaller fence.
	t.Run("RefusesAFenceDefaultFromAnotherSequence", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := fromSchemaSQLFenceDefault(t, pool, "GENERATED BY DEFAULT AS IDENTITY")
		require.Error(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)),
			"Migrate accepted a fence column whose default is not nextval of %s_fence_seq", table)
	})

	// A lease table or fence sequence that an operator made UNLOGGED is emptied
	// by a crash: every live lease could then be claimed again and every fence
	// issued again. Migrate, which runs at every deploy, refuses it, naming the
	// fix, and changes nothing.
	t.Run("RefusesWhatACrashWouldEmpty", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		for _, what := range []string{"TABLE", "SEQUENCE"} {
			table := pgtest.Table(t, pool)
			name := pgx.Identifier{table}.Sanitize()
			if what == "SEQUENCE" {
				name = pgx.Identifier{table + "_fence_seq"}.Sanitize()
			}
			_, err := pool.Exec(ctx, fmt.Sprintf(`ALTER %s %s SET UNLOGGED`, what, name))
			if what == "SEQUENCE" && serverVersionNum(ctx, t, pool) < 150000 {
				// Unlogged sequences exist from PostgreSQL 15: before, the
				// case cannot arise, and the server refuses to make one.
				require.Error(t, err, "PostgreSQL before 15 made an unlogged sequence")
				continue
			}
			require.NoError(t, err)
			err = pglease.Migrate(ctx, pool, pglease.WithTable(table))
			require.ErrorContains(t, err, "is UNLOGGED: a crash would empty it", what)
			require.ErrorContains(t, err, "SET LOGGED", what)
			_, err = pool.Exec(ctx, fmt.Sprintf(`ALTER %s %s SET LOGGED`, what, name))
			require.NoError(t, err)
			require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), what)
		}
	})
	// Guarantee: Migrate reports success only when its commit was
	// confirmed: one whose wait for a synchronous standby a cancel request
	// cut short is an error wrapping the context's end (Migrate is
	// idempotent: run it again).
	t.Run("UnreplicatedCommitIsNotReportedDone", func(t *testing.T) {
		t.Parallel()
		ctx, srv, pool, base := pgtest.PrivateSetup(t)
		dbs := map[string]pglease.DB{
			"pool_cancel_request": pgtest.CancelRequestPool(t, srv.DSN(), nil),
			"sql_pq":              pglease.SQL(pgtest.OpenSQL(t, pool, "pq")),
		}
		for name := range dbs {
			// A row expired longer ago than the default retention, in a
			// table of each: Migrate's purge deletes it, so its commit
			// waits for the standby.
			require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(base+"_"+name)))
			insertAdminRow(t, pool, pgx.Identifier{base + "_" + name}.Sanitize(), "old", "gone", 49*time.Hour, -48*time.Hour)
		}
		pgtest.AbsentStandby(ctx, t, srv.DSN())
		for name, db := range dbs {
			table := base + "_" + name
			t.Run(name, func(t *testing.T) {
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				defer cancel()
				err := pglease.Migrate(cctx, db, pglease.WithTable(table))
				require.Error(t, err, "a migration whose commit was not replicated was reported done")
				require.ErrorIs(t, err, context.DeadlineExceeded)
			})
		}
	})
	// Guarantee: Migrate adds the columns added since a table was made
	// (tick, released_at) to a table made without them, keeping its rows;
	// a Locker refuses such a table until then, naming the ALTER TABLE.
	t.Run("AddsTheColumnsAddedSinceTheTableWasMade", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		name := pgx.Identifier{table}.Sanitize()
		_, err := pool.Exec(ctx, "ALTER TABLE "+name+" DROP COLUMN tick, DROP COLUMN released_at")
		require.NoError(t, err)
		insertAdminRow(t, pool, name, "kept", "old", time.Minute, time.Hour)
		_, err = pgtest.Locker(t, pool, table, "a").Claim(ctx, "k")
		require.ErrorContains(t, err, "lacks the columns released_at, tick")
		require.ErrorContains(t, err, "ADD COLUMN IF NOT EXISTS tick timestamptz, ADD COLUMN IF NOT EXISTS released_at timestamptz")

		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))
		var holder string
		require.NoError(t, pool.QueryRow(ctx, "SELECT holder FROM "+name+" WHERE key = 'kept' AND tick IS NULL AND released_at IS NULL").Scan(&holder))
		assert.Equal(t, "old", holder, "the row is kept")
		lease, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
	})
	// Guarantee: a statement of Migrate cut short by the end of its context
	// (the server reports only "canceling statement due to user request")
	// fails with an error that names the context's end, whichever statement
	// it was; nothing is committed.
	t.Run("NamesTheEndOfItsContext", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Table(t, pool)
		name := pgx.Identifier{table}.Sanitize()
		// The table locked by another transaction: Migrate's statements
		// that touch it wait until its context ends and pgx sends a
		// cancel request.
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()
		_, err = tx.Exec(ctx, "LOCK TABLE "+name+" IN ACCESS EXCLUSIVE MODE")
		require.NoError(t, err)
		// Its context ends once a statement of it has waited for that lock
		// in two readings of the server 50 ms apart (however slowly a busy
		// machine got it there).
		cctx, cancel := context.WithCancel(ctx)
		defer cancel()
		go func() {
			defer cancel()
			last := 0
			for ctx.Err() == nil {
				var pid int
				err := pool.QueryRow(ctx, "SELECT coalesce(min(pid), 0) FROM pg_locks WHERE relation = $1::regclass AND NOT granted", name).Scan(&pid)
				if err != nil || (pid != 0 && pid == last) {
					return
				}
				last = pid
				time.Sleep(50 * time.Millisecond)
			}
		}()
		err = pglease.Migrate(cctx, pgtest.CancelRequestPool(t, pgtest.Server.DSN(), nil), pglease.WithTable(table))
		require.Error(t, err)
		require.ErrorContains(t, err, "57014", "cut short by the server on the cancel request")
		require.ErrorIs(t, err, context.Canceled)
	})
}

// TestSchema pins schema.sql, for operators who apply the DDL by hand: it
// is exactly what Migrate runs and makes the same catalog objects.
func TestSchema(t *testing.T) {
	t.Parallel()
	// Guarantee: schema.sql is exactly the DDL Migrate runs for the default
	// table.
	t.Run("IsTheDDLMigrateRuns", func(t *testing.T) {
		t.Parallel()
		want, err := pglease.Schema()
		require.NoError(t, err)

		onDisk, err := os.ReadFile("schema.sql")
		require.NoError(t, err)
		body := stripComments(string(onDisk))
		assert.Equal(t, want, body, "schema.sql, after its comment, is what Migrate runs: regenerate it from pglease.Schema()")
		assert.Contains(t, body, `CREATE TABLE IF NOT EXISTS "lease"`)
	})

	// Guarantee: schema.sql applied by hand creates the same catalog objects as
	// Migrate.
	t.Run("AppliedByHandMatchesMigrate", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		defer conn.Close(context.Background())

		byFile, byMigrate := pgtest.Name("s_schemasql_file"), pgtest.Name("s_schemasql_migrate")
		for _, s := range []string{byFile, byMigrate} {
			_, err := conn.Exec(ctx, "CREATE SCHEMA "+pgx.Identifier{s}.Sanitize())
			require.NoError(t, err)
			t.Cleanup(func() {
				_, _ = conn.Exec(context.Background(), "DROP SCHEMA "+pgx.Identifier{s}.Sanitize()+" CASCADE")
			})
		}

		// As a migration tool would: the file as is, in the schema the
		// connection's search_path points at.
		_, err = conn.Exec(ctx, "SET search_path = "+pgx.Identifier{byFile}.Sanitize())
		require.NoError(t, err)
		_, err = conn.Exec(ctx, schemaFile(t))
		require.NoError(t, err)
		require.NoError(t, pglease.Migrate(ctx, conn, pglease.WithTable(byMigrate+".lease")))

		fromFile := describeLeaseTable(t, conn, byFile)
		fromMigrate := describeLeaseTable(t, conn, byMigrate)
		for what := range catalogQueries {
			assert.Equal(t, fromMigrate[what], fromFile[what], "%s of the table created by schema.sql and by Migrate", what)
		}

		// The comparison is only worth something if it saw the real objects.
		assert.Equal(t, []string{"relkind=r persistence=p"}, fromFile["table"], "an ordinary LOGGED table")
		assert.Contains(t, fromFile["columns"],
			"fence bigint notnull=t default=nextval('<schema>.lease_fence_seq'::regclass) identity= generated= collation=-",
			"the fence comes from the sequence beside the table")
		assert.Contains(t, fromFile["columns"],
			"acquired_at timestamp with time zone notnull=t default=clock_timestamp() identity= generated= collation=-")
		assert.Contains(t, fromFile["columns"],
			"tick timestamp with time zone notnull=f default=- identity= generated= collation=-", "a nullable tick, for jobs of ticks")
		assert.Contains(t, fromFile["columns"],
			"released_at timestamp with time zone notnull=f default=- identity= generated= collation=-", "when its holder released it")
		assert.Len(t, fromFile["columns"], 7)
		assert.Contains(t, fromFile["constraints"], "lease_check c CHECK ((expires_at > acquired_at))")
		assert.Contains(t, fromFile["constraints"], "lease_pkey p PRIMARY KEY (key)")
		assert.Len(t, fromFile["indexes"], 1, "only the primary key: no index on expires_at")
		assert.Equal(t, []string{"lease_fence_seq type=bigint start=1 increment=1 min=1 max=9223372036854775807 cache=1 cycle=f"},
			fromFile["sequence"])
	})
}

// catalogQueries describe a lease table and its sequence as the server
// stores them, in a stable order. Each takes the schema name as $1 and
// returns one text column. They run with search_path = pg_catalog, so
// pg_get_expr and pg_get_constraintdef qualify every name with its schema,
// which describeLeaseTable then replaces by a placeholder.
var catalogQueries = map[string]string{
	"table": `SELECT format('relkind=%s persistence=%s', c.relkind, c.relpersistence)
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'lease'`,
	"columns": `SELECT format('%s %s notnull=%s default=%s identity=%s generated=%s collation=%s',
              a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull,
              coalesce(pg_get_expr(d.adbin, d.adrelid), '-'), a.attidentity, a.attgenerated,
              coalesce(co.collname, '-'))
  FROM pg_attribute a
  JOIN pg_class c ON c.oid = a.attrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
  LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
  LEFT JOIN pg_collation co ON co.oid = a.attcollation
 WHERE n.nspname = $1 AND c.relname = 'lease' AND a.attnum > 0 AND NOT a.attisdropped
 ORDER BY a.attnum`,
	"constraints": `SELECT format('%s %s %s', con.conname, con.contype, pg_get_constraintdef(con.oid))
  FROM pg_constraint con
  JOIN pg_class c ON c.oid = con.conrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'lease'
 ORDER BY con.conname`,
	"indexes": `SELECT pg_get_indexdef(i.indexrelid)
  FROM pg_index i
  JOIN pg_class c ON c.oid = i.indrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1 AND c.relname = 'lease'
 ORDER BY 1`,
	"sequence": `SELECT format('%s type=%s start=%s increment=%s min=%s max=%s cache=%s cycle=%s',
              c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement,
              s.seqmin, s.seqmax, s.seqcache, s.seqcycle)
  FROM pg_sequence s
  JOIN pg_class c ON c.oid = s.seqrelid
  JOIN pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = $1
 ORDER BY c.relname`,
}

// describeLeaseTable returns the catalog description of schema.lease and the
// sequences of schema, with the schema name replaced by "<schema>".
func describeLeaseTable(t *testing.T, conn *pgx.Conn, schema string) map[string][]string {
	t.Helper()
	ctx := pgtest.Ctx(t)
	_, err := conn.Exec(ctx, `SET search_path = pg_catalog`)
	require.NoError(t, err)
	out := make(map[string][]string, len(catalogQueries))
	for what, q := range catalogQueries {
		rows, err := conn.Query(ctx, q, schema)
		require.NoError(t, err, what)
		lines, err := pgx.CollectRows(rows, pgx.RowTo[string])
		require.NoError(t, err, what)
		for i, l := range lines {
			lines[i] = strings.ReplaceAll(l, schema+".", "<schema>.")
		}
		out[what] = lines
	}
	return out
}

// stallClaims makes every claim of a Locker named holder stall right after it has built
// its row (and so drawn its fence from the column's DEFAULT), before it
// looks for a conflicting row, until the returned function is called: a
// BEFORE INSERT trigger waits on an advisory lock the test holds. This is
// where a descheduled backend, or one waiting on another transaction, sits.
func stallClaims(t *testing.T, table, holder string) (resume func()) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	name := pgx.Identifier{table}.Sanitize()
	fn := pgx.Identifier{table + "_stall"}.Sanitize()
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF split_part(NEW.holder, '#', 1) = %s THEN
        -- The stall is a claim's, not a row lock: a claim sent with a lock
        -- wait (a burst's) waits it out as a claim sent without one does.
        PERFORM set_config('lock_timeout', '0', true);
        PERFORM pg_advisory_xact_lock_shared(hashtext(TG_TABLE_NAME));
    END IF;
    RETURN NEW;
END $$`, fn, quoteLiteral(holder)),
		fmt.Sprintf(`CREATE TRIGGER stall BEFORE INSERT ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, name, fn),
		fmt.Sprintf(`SELECT pg_advisory_lock(hashtext(%s))`, quoteLiteral(table)),
	} {
		_, err := conn.Exec(ctx, stmt)
		require.NoError(t, err, "%s", stmt)
	}
	resumed := false
	resume = func() {
		if !resumed {
			resumed = true
			require.NoError(t, conn.Close(context.Background())) // drops the advisory lock
		}
	}
	t.Cleanup(resume)
	return resume
}

func quoteLiteral(s string) string { return "'" + s + "'" } // test names only: no quotes in them

// waitStalled waits until a claim on table sits in the stall trigger.
func waitStalled(t *testing.T, db pglease.DB, table string) {
	t.Helper()
	require.Eventually(t, func() bool {
		var n int
		require.NoError(t, db.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND wait_event = 'advisory' AND query LIKE $1`,
			"INSERT INTO "+pgx.Identifier{table}.Sanitize()+"%").Scan(&n))
		return n == 1
	}, 10*time.Second, 5*time.Millisecond, "the claim never reached the stall")
}

// serverVersionNum is the server's server_version_num (150004 for 15.4).
func serverVersionNum(ctx context.Context, t *testing.T, db pglease.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(ctx, `SELECT current_setting('server_version_num')::int`).Scan(&n))
	return n
}

// schemaFile is schema.sql, as an operator applies it by hand.
func schemaFile(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile("schema.sql")
	require.NoError(t, err)
	return string(b)
}
