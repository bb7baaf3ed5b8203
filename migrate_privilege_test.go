package pglease_test

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// runtimeRole creates a login role with grants (each with %s for the
// role), and returns a pool connected as it; dropped at cleanup.
func runtimeRole(t *testing.T, admin *pgxpool.Pool, grants ...string) *pgxpool.Pool {
	t.Helper()
	ctx := pgtest.Ctx(t)
	role := pgtest.Name("pglease_role")
	stmts := []string{fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'role-pw'`, role)}
	for _, g := range grants {
		stmts = append(stmts, fmt.Sprintf(g, role))
	}
	for _, stmt := range stmts {
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
	})
	return pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "role-pw"
	})
}

// TestPrivilege pins what roles and credentials need and show: the
// documented grants run everything at runtime, Migrate names what a lesser
// role lacks, and the password never reaches a log or an error.
func TestPrivilege(t *testing.T) {
	t.Parallel()
	// A role with only the grants schema.sql documents for the service's role
	// (SELECT, INSERT, UPDATE on the table, USAGE on its sequence, and USAGE on
	// the schema the table lives in) runs everything a Locker does, on a table
	// made by Migrate or by schema.sql applied by hand: a claim, another
	// holder's ErrHeld, heartbeats, a release, the re-claim of the released row
	// (ON CONFLICT DO UPDATE, a fresh fence) and gocron's Lock and Unlock. What
	// it cannot run, Migrate, is TestPrivilege/MigrateNamesTheMissingPrivilege.
	t.Run("DocumentedGrantsRunEverything", func(t *testing.T) {
		t.Parallel()
		admin := pgtest.Pool(t, nil)
		for _, tc := range []struct {
			name string
			// table creates a lease table and says which grants the service's
			// role needs on it.
			table func(t *testing.T) (table string, grants []string)
		}{
			{"table made by Migrate", func(t *testing.T) (string, []string) {
				t.Helper()
				table := pgtest.Table(t, admin)
				tbl, seq := pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_fence_seq"}.Sanitize()
				return table, []string{`GRANT SELECT, INSERT, UPDATE ON ` + tbl + ` TO %s`, `GRANT USAGE ON SEQUENCE ` + seq + ` TO %s`}
			}},
			{"schema.sql applied by hand", func(t *testing.T) (string, []string) {
				t.Helper()
				ctx := pgtest.Ctx(t)
				schema := pgtest.Name("s_grants")
				conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
				require.NoError(t, err)
				defer conn.Close(context.Background())
				// As a migration tool would: the file as is, in the schema the
				// connection's search_path points at.
				for _, stmt := range []string{"CREATE SCHEMA " + schema, "SET search_path = " + schema, schemaFile(t)} {
					_, err := conn.Exec(ctx, stmt)
					require.NoError(t, err, stmt)
				}
				t.Cleanup(func() { _, _ = admin.Exec(context.Background(), "DROP SCHEMA "+schema+" CASCADE") })
				return schema + ".lease", []string{
					`GRANT USAGE ON SCHEMA ` + schema + ` TO %s`,
					`GRANT SELECT, INSERT, UPDATE ON ` + schema + `.lease TO %s`,
					`GRANT USAGE ON SEQUENCE ` + schema + `.lease_fence_seq TO %s`,
				}
			}},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				table, grants := tc.table(t)
				rt := runtimeRole(t, admin, grants...)
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, rt, table, "least", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
				other := pgtest.Locker(t, rt, table, "other")

				lease, err := l.Claim(ctx, "k")
				require.NoError(t, err, "claim: INSERT, UPDATE and nextval on the sequence")
				_, err = other.Claim(ctx, "k")
				require.ErrorIs(t, err, pglease.ErrHeld)
				for range 3 {
					events.WaitFor(t, pglease.EventExtended, 2*time.Second)
				}
				require.NoError(t, lease.Err(), "heartbeat: UPDATE")
				require.NoError(t, lease.Unlock(ctx), "release: UPDATE")
				row, _ := pgtest.ReadRow(t, admin, table, "k")
				require.False(t, row.Live)
				again, err := other.Claim(ctx, "k")
				require.NoError(t, err, "re-claim of a released row: ON CONFLICT DO UPDATE")
				assert.Greater(t, again.Fence(), lease.Fence())

				// The gocron path: Lock, the job sees its lease, Unlock.
				sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(l))
				require.NoError(t, err)
				defer func() { _ = sched.Shutdown() }()
				fences := make(chan int64, 1)
				_, err = sched.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), gocron.NewTask(func() {
					if lease, ok := l.Held("job"); ok {
						fences <- lease.Fence()
					}
				}), gocron.WithName("job"))
				require.NoError(t, err)
				sched.Start()
				select {
				case f := <-fences:
					require.Greater(t, f, again.Fence())
				case <-time.After(10 * time.Second):
					t.Fatal("the job did not run under its lease")
				}
				require.Eventually(t, func() bool { r, _ := pgtest.ReadRow(t, admin, table, "job"); return !r.Live }, 5*time.Second, 10*time.Millisecond, "gocron's Unlock released it")
				assert.Zero(t, events.Count(pglease.EventClaimFailed)+events.Count(pglease.EventReleaseFailed)+events.Count(pglease.EventLost)+events.Count(pglease.EventHeartbeatFailed))
			})
		}
	})

	// Guarantee: Migrate run as a lesser role names the privilege it lacks.
	t.Run("MigrateNamesTheMissingPrivilege", func(t *testing.T) {
		t.Parallel()
		admin := pgtest.Pool(t, nil)
		table := pgtest.Table(t, admin)
		tbl, seq := pgx.Identifier{table}.Sanitize(), pgx.Identifier{table + "_fence_seq"}.Sanitize()
		runtime := []string{`GRANT SELECT, INSERT, UPDATE ON ` + tbl + ` TO %s`, `GRANT USAGE ON SEQUENCE ` + seq + ` TO %s`}
		for _, tc := range []struct {
			name   string
			grants []string
			server string // what PostgreSQL says is missing
		}{
			{"runtime grants only", runtime, "permission denied for schema public"},
			{"CREATE on the schema but not the owner", append(runtime, `GRANT CREATE ON SCHEMA public TO %s`), "must be owner of table " + table + "_run"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				pool := runtimeRole(t, admin, tc.grants...)
				before := fullSnapshot(t, admin, table)
				err := pglease.Migrate(ctx, pool, pglease.WithTable(table))
				require.Error(t, err)
				var pgErr *pgconn.PgError
				require.ErrorAs(t, err, &pgErr, "the driver's error is kept")
				require.Equal(t, "42501", pgErr.Code)
				server := tc.server
				if serverVersionNum(ctx, t, admin) < 150000 {
					// Before PostgreSQL 15 every role may create in schema
					// public: what is missing then is the ledger's index,
					// which only its owner may create, even IF NOT EXISTS.
					server = "must be owner of table " + table + "_run"
				}
				require.Contains(t, err.Error(), server)
				require.Contains(t, err.Error(), "Migrate needs CREATE on the schema, DELETE on the table and to own the ledger")
				require.Contains(t, err.Error(), "SELECT, INSERT, UPDATE on the table and its ledger and USAGE on the sequence")
				require.Equal(t, before, fullSnapshot(t, admin, table))
			})
		}
	})

	// Guarantee: the password never appears in logs or errors, whether the
	// server refuses it or is unreachable.
	t.Run("PasswordNeverInLogsOrErrors", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		// A server of our own that asks for passwords (SCRAM) from every role
		// but the superuser.
		srv, err := pgserver.Start(ctx, pgserver.Options{Private: true})
		require.NoError(t, err)
		t.Cleanup(func() { require.NoError(t, srv.Close()) })
		admin := pgtest.PoolAt(t, srv.DSN(), nil)
		var hba string
		require.NoError(t, admin.QueryRow(ctx, `SHOW hba_file`).Scan(&hba))
		_, err = admin.Exec(ctx, fmt.Sprintf(`COPY (SELECT unnest(ARRAY['host all postgres 127.0.0.1/32 trust', 'host all all 127.0.0.1/32 scram-sha-256'])) TO %s`,
			"'"+strings.ReplaceAll(hba, "'", "''")+"'"))
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `SELECT pg_reload_conf()`)
		require.NoError(t, err)
		_, err = admin.Exec(ctx, `CREATE ROLE app LOGIN PASSWORD 'the-right-one'`)
		require.NoError(t, err)

		const secret = "Sup3r:Secr3t/p@ss%w0rd"
		cfg, err := pgx.ParseConfig(srv.DSN())
		require.NoError(t, err)
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", "127.0.0.1:0")
		require.NoError(t, err)
		closedPort := ln.Addr().(*net.TCPAddr).Port
		require.NoError(t, ln.Close())
		dsn := func(port int) string {
			return fmt.Sprintf("postgres://app:%s@127.0.0.1:%d/%s?sslmode=disable&connect_timeout=2", url.QueryEscape(secret), port, cfg.Database)
		}
		for _, tc := range []struct {
			name, dsn, says string
		}{
			{"wrong password", dsn(int(cfg.Port)), "password authentication failed"},
			{"unreachable port", dsn(closedPort), "connect"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				var logs lockedBuffer
				logger := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
				events := pgtest.NewEvents(t)
				pool, err := pgxpool.New(ctx, tc.dsn)
				require.NoError(t, err)
				defer pool.Close()
				// Require the server to have refused the password before
				// looking: a check that cannot fail proves nothing.
				require.Eventually(t, func() bool {
					c, err := pgx.Connect(ctx, tc.dsn)
					if err == nil {
						_ = c.Close(ctx)
					}
					return err != nil && strings.Contains(err.Error(), tc.says)
				}, 10*time.Second, 50*time.Millisecond)

				l := pgtest.Each(pglease.NewLocker(pool, pglease.WithHolder("h"), pglease.WithLogger(logger), pglease.WithHook(events.Hook), pglease.WithTimeout(3*time.Second)))
				_, claimErr := l.Claim(ctx, "k")
				_, lockErr := l.Lock(ctx, "k")
				errs := []error{claimErr, lockErr, pglease.Migrate(ctx, pool)}
				require.NoError(t, l.Close(ctx))
				for _, e := range errs {
					require.Error(t, e)
					require.Contains(t, e.Error(), tc.says)
				}
				for _, e := range events.All() {
					if e.Err != nil {
						errs = append(errs, e.Err)
					}
				}
				require.Contains(t, logs.String(), tc.says, "the failure is logged")
				for _, leak := range []string{secret, url.QueryEscape(secret), url.PathEscape(secret)} {
					require.NotContains(t, logs.String(), leak)
					for _, e := range errs {
						require.NotContains(t, fmt.Sprintf("%v %+v %#v", e, e, e), leak)
					}
				}
				t.Logf("figures: %s: %d errors and %d bytes of logs checked, password absent; e.g. %v", tc.name, len(errs), len(logs.String()), errs[0])
			})
		}
	})
}
