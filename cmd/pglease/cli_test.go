package main

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMigrateIsIdempotentAndCreatesATableALockerCanUse(t *testing.T) {
	t.Parallel()
	table := pgtest.TableName()
	for range 2 {
		out := ok(t, "migrate", "-table", table, "-retention", "1h")
		assert.Contains(t, out, "table "+table+" and sequence "+table+"_fence_seq are ready")
	}
	l := pgtest.Locker(t, pgtest.Pool(t, nil), table, "a")
	_, err := l.Claim(pgtest.Ctx(t), "job")
	require.NoError(t, err)
}

func TestStatusListsEveryKeySortedWithHolderFenceAndState(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	const ttl = time.Minute
	l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(ttl))
	b, err := l.Claim(ctx, "b-job")
	require.NoError(t, err)
	a, err := l.Claim(ctx, "a-job")
	require.NoError(t, err)
	insertRow(t, pool, table, "c-job", "replica-gone", 2*time.Hour, -time.Hour) // lapsed: expired, never released
	d, err := l.Claim(ctx, "d-job")
	require.NoError(t, err)
	require.NoError(t, d.Unlock(ctx))

	out := ok(t, "status", "-table", table)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 5, out)
	assert.Equal(t, []string{"KEY", "HOLDER", "FENCE", "ACQUIRED", "EXPIRES", "IN", "STATE"}, strings.Fields(lines[0]))
	for i, want := range []struct {
		key, holder string
		fence       int64
		state       string
	}{
		{"a-job", l.Holder(), a.Fence(), "live"},
		{"b-job", l.Holder(), b.Fence(), "live"},
		{"c-job", "replica-gone", 0, "lapsed"},
		{"d-job", l.Holder(), d.Fence(), "released"},
	} {
		f := strings.Fields(lines[i+1])
		require.Len(t, f, 6, lines[i+1])
		assert.Equal(t, want.key, f[0])
		assert.Equal(t, want.holder, f[1])
		if want.fence != 0 {
			assert.Equal(t, fmt.Sprint(want.fence), f[2])
		}
		assert.Equal(t, want.state, f[5])
	}
	assert.True(t, strings.HasPrefix(strings.Fields(lines[3])[4], "-"), "an expired key expires in a negative time: %s", lines[3])

	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(ok(t, "status", "-table", table, "-json")), &rows))
	require.Len(t, rows, 4)
	assert.Equal(t, "a-job", rows[0].Key)
	require.NotNil(t, rows[0].Fence)
	assert.Equal(t, a.Fence(), *rows[0].Fence)
	assert.Equal(t, l.Holder(), rows[0].Holder)
	assert.True(t, rows[0].Live)
	require.NotNil(t, rows[0].ExpiresInSeconds)
	assert.InDelta(t, ttl.Seconds(), *rows[0].ExpiresInSeconds, 10, "a fresh lease expires in about a TTL")
	assert.Equal(t, a.AcquiredAt().UnixMicro(), rows[0].AcquiredAt.UnixMicro())
	assert.Equal(t, "b-job", rows[1].Key)
	assert.Equal(t, "c-job", rows[2].Key)
	assert.False(t, rows[2].Live)
	require.NotNil(t, rows[2].ExpiresInSeconds)
	assert.InDelta(t, -3600, *rows[2].ExpiresInSeconds, 10)
	assert.Equal(t, "lapsed", rows[2].State)
	assert.Nil(t, rows[2].ReleasedAt)
	assert.Equal(t, "released", rows[3].State)
	require.NotNil(t, rows[3].ReleasedAt, "the release's time")
	assert.False(t, rows[3].ReleasedAt.Before(d.AcquiredAt()))
	assert.Equal(t, "live", rows[0].State)
}

func TestRunsListsTheRunsOfJobsWithTicksAndHowTheyEnded(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table := migrated(t)
	job, err := pgtest.Locker(t, pgtest.Pool(t, nil), table, "replica-a").Job(pglease.WithPeriod(time.Hour))
	require.NoError(t, err)
	lease, err := job.Claim(ctx, "hourly")
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))

	var rows []runRow
	require.NoError(t, json.Unmarshal([]byte(ok(t, "runs", "-table", table, "-json", "-job", "hourly")), &rows))
	require.Len(t, rows, 1)
	assert.Equal(t, "hourly", rows[0].Key)
	assert.Equal(t, lease.Fence(), rows[0].Fence)
	assert.True(t, lease.Tick().Equal(rows[0].Tick.Time))
	assert.Equal(t, "completed", rows[0].Outcome)
	require.NotNil(t, rows[0].EndedAt, "released: its end is known")

	out := ok(t, "runs", "-table", table)
	lines := strings.Split(strings.TrimSpace(out), "\n")
	require.Len(t, lines, 2, out)
	assert.Equal(t, []string{"JOB", "TICK", "FENCE", "HOLDER", "STARTED", "TOOK", "OUTCOME"}, strings.Fields(lines[0]))
	assert.Equal(t, "completed", strings.Fields(lines[1])[len(strings.Fields(lines[1]))-1])
	assert.JSONEq(t, "[]", ok(t, "runs", "-table", table, "-json", "-job", "another"))
}

func TestStatusJSONOfAnEmptyTableIsAnEmptyArray(t *testing.T) {
	t.Parallel()
	table := migrated(t)
	assert.JSONEq(t, "[]", ok(t, "status", "-json", "-table", table))
}

func TestReleaseOfALiveKeyMakesItClaimableByAnotherHolderAndItsHolderLosesIt(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	a := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(10*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
	b := pgtest.Locker(t, pool, table, "replica-b")
	lease, err := a.Claim(ctx, "nightly")
	require.NoError(t, err)
	_, err = b.Claim(ctx, "nightly")
	require.ErrorIs(t, err, pglease.ErrHeld)

	r0 := runCmd(t, "release", "-now", "-dsn", pgtest.Server.DSN(), "-table", table, "nightly")
	require.Equal(t, exitOK, r0.code, r0.stderr)
	out := r0.stdout
	assert.Contains(t, out, `released key "nightly"`)
	assert.Contains(t, out, fmt.Sprintf("holder %q", a.Holder()))
	assert.Contains(t, out, fmt.Sprintf("fence %d", lease.Fence()))
	assert.Contains(t, r0.stderr, "WARNING", "-now says what it risks")
	assert.Contains(t, r0.stderr, "two replicas may run the job at once")

	r, _ := pgtest.ReadRow(t, pool, table, "nightly")
	assert.False(t, r.Live, "expired now")
	assert.Equal(t, a.Holder(), r.Holder, "holder untouched")
	assert.Equal(t, lease.Fence(), r.Fence, "fence untouched")
	assert.True(t, r.ExpiresAt.After(r.AcquiredAt), "the CHECK holds")

	taken, err := b.Claim(ctx, "nightly")
	require.NoError(t, err, "another holder can claim the released key")
	assert.Greater(t, taken.Fence(), lease.Fence(), "with a greater fence")
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the former holder did not notice the loss")
	}
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
}

func TestReleaseOfAnExpiredKeyChangesNothingAndOfAMissingKeyExitsOne(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	insertRow(t, pool, table, "old", "replica-gone", 2*time.Hour, -time.Hour)
	before, _ := pgtest.ReadRow(t, pool, table, "old")

	out := ok(t, "release", "-table", table, "old")
	assert.Contains(t, out, `key "old" was not live`)
	after, _ := pgtest.ReadRow(t, pool, table, "old")
	assert.Equal(t, before, after, "an expired row is left as it was")

	insertRow(t, pool, table, "-dash", "replica-gone", 2*time.Hour, -time.Hour)
	r := runCmd(t, "release", "-table", table, "-dsn", pgtest.Server.DSN(), "--", "-dash")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `key "-dash" was not live`, "after --, a key may start with a dash")

	r = runCmd(t, "release", "-dsn", pgtest.Server.DSN(), "-table", table, "never-claimed")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, `key "never-claimed" not found in table `+table)
	assert.Empty(t, r.stdout)
}

func TestReleaseKeepsTheCheckConstraintWhenTheServerClockIsBehindTheClaim(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	// acquired_at an hour ahead of clock_timestamp(): as if the server's
	// clock had been set back since the claim. clock_timestamp() alone
	// would violate CHECK (expires_at > acquired_at).
	insertRow(t, pool, table, "ahead", "replica-a", -time.Hour, 2*time.Hour)

	r := runCmd(t, "release", "-now", "-dsn", pgtest.Server.DSN(), "-table", table, "ahead")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stderr, "the server clock is behind the claim's acquired_at")
	row, _ := pgtest.ReadRow(t, pool, table, "ahead")
	assert.Equal(t, row.AcquiredAt.Add(time.Microsecond), row.ExpiresAt, "one microsecond after acquired_at, the smallest expiry the CHECK allows")
}

func TestPurgeDeletesOnlyRowsExpiredLongerAgoAndPrintsHowMany(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	insertRow(t, pool, table, "old1", "h", 3*time.Hour, -2*time.Hour)
	insertRow(t, pool, table, "old2", "h", 3*time.Hour, -90*time.Minute)
	insertRow(t, pool, table, "recent", "h", time.Hour, -10*time.Minute)
	insertRow(t, pool, table, "live", "h", time.Minute, time.Hour)

	assert.Equal(t, fmt.Sprintf("purged 2 rows of %s expired more than 1h0m0s ago\n", table), ok(t, "purge", "-table", table, "-older-than", "1h"))
	assert.Contains(t, ok(t, "purge", "-table", table, "-older-than", "1h"), "purged 0 rows")

	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(ok(t, "status", "-json", "-table", table)), &rows))
	require.Len(t, rows, 2)
	assert.ElementsMatch(t, []string{"live", "recent"}, []string{rows[0].Key, rows[1].Key},
		"a live lease and a row expired less than the horizon ago are never purged")
}

func TestPurgeAndMigrateRefuseAHorizonBelowMinRetentionAndSayWhy(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	insertRow(t, pool, table, "recent", "h", time.Hour, -10*time.Minute)
	for _, args := range [][]string{
		{"purge", "-table", table, "-older-than", "0s"},
		{"purge", "-table", table, "-older-than", "59m59s"},
		{"migrate", "-table", table, "-retention", "0s"},
		{"migrate", "-table", table, "-retention", "10m"},
	} {
		r := runCmd(t, append(args, "-dsn", pgtest.Server.DSN())...)
		assert.Equal(t, exitUsage, r.code, "%v: stderr: %s", args, r.stderr)
		assert.Contains(t, r.stderr, "must be at least 1h0m0s: a claim", "%v", args)
		assert.Contains(t, r.stderr, "a fence smaller than one already handed out", "%v: the refusal says why", args)
		assert.Empty(t, r.stdout)
	}
	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(ok(t, "status", "-json", "-table", table)), &rows))
	require.Len(t, rows, 1, "nothing was purged")
}

func TestBadUsageExitsTwoWithAMessageAndSendsNothing(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Server.DSN()
	for name, args := range map[string][]string{
		"no command":                {},
		"unknown command":           {"frobnicate", "-dsn", dsn},
		"unknown flag":              {"status", "-dsn", dsn, "-verbose"},
		"bad duration":              {"purge", "-dsn", dsn, "-older-than", "soon"},
		"purge without -older-than": {"purge", "-dsn", dsn},
		"negative -older-than":      {"purge", "-dsn", dsn, "-older-than", "-1h"},
		"negative -retention":       {"migrate", "-dsn", dsn, "-retention", "-1h"},
		"-older-than below 1h":      {"purge", "-dsn", dsn, "-older-than", "30m"},
		"-retention below 1h":       {"migrate", "-dsn", dsn, "-retention", "30m"},
		"release without key":       {"release", "-dsn", dsn},
		"release with two keys":     {"release", "-dsn", dsn, "a", "b"},
		"status with an argument":   {"status", "-dsn", dsn, "extra"},
		"table with a semicolon":    {"status", "-dsn", dsn, "-table", "lease; DROP TABLE lease"},
		"table with three parts":    {"status", "-dsn", dsn, "-table", "a.b.c"},
		"empty table":               {"status", "-dsn", dsn, "-table", ""},
		"zero timeout":              {"status", "-dsn", dsn, "-timeout", "0s"},
		"unparsable dsn":            {"status", "-dsn", "postgres://u:pw@host:notaport/db"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			r := runCmd(t, args...)
			assert.Equal(t, exitUsage, r.code, "stderr: %s", r.stderr)
			assert.NotEmpty(t, r.stderr, "a usage error says what is wrong")
			assert.Empty(t, r.stdout)
		})
	}
}

func TestHelpPrintsTheExitCodesAndExitsZero(t *testing.T) {
	t.Parallel()
	r := runCmd(t, "-h")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stdout, "Exit status:\n  0  success\n  1  operational failure")
	assert.Contains(t, r.stdout, "2  usage error")

	r = runCmd(t, "purge", "-h")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stderr, "Usage: pglease purge")
	assert.Contains(t, r.stderr, "-older-than duration")
	assert.Contains(t, r.stderr, "Exit status: 0 success, 1 operational failure, 2 usage error.")
}

func TestWithoutDsnTheEnvironmentIsUsedAndWithoutEitherItIsAUsageError(t *testing.T) {
	table := migrated(t)
	t.Setenv(envDSN, pgtest.Server.DSN())
	r := runCmd(t, "status", "-json", "-table", table)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.JSONEq(t, "[]", r.stdout)

	// Neither -dsn nor PGLEASE_DATABASE_URL: libpq's variables, as psql
	// reads them.
	t.Setenv(envDSN, "")
	u, err := url.Parse(pgtest.Server.DSN())
	require.NoError(t, err)
	pw, _ := u.User.Password()
	for name, value := range map[string]string{
		"PGHOST": u.Hostname(), "PGPORT": u.Port(), "PGUSER": u.User.Username(), "PGPASSWORD": pw,
		"PGDATABASE": strings.TrimPrefix(u.Path, "/"), "PGSSLMODE": u.Query().Get("sslmode"),
	} {
		t.Setenv(name, value)
	}
	r = runCmd(t, "status", "-json", "-table", table)
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.JSONEq(t, "[]", r.stdout)
	t.Setenv("PGPORT", strconv.Itoa(closedPort(t)))
	r = runCmd(t, "status", "-table", table)
	assert.Equal(t, exitFail, r.code, "PGPORT is read: nothing listens there")
	assert.Contains(t, r.stderr, "connecting to")

	for _, name := range []string{"PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD"} {
		t.Setenv(name, "")
	}
	r = runCmd(t, "status", "-table", table)
	assert.Equal(t, exitUsage, r.code)
	assert.Contains(t, r.stderr, "no database: give -dsn, or set PGLEASE_DATABASE_URL, or libpq's PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD as for psql")
}

func TestAWrongNumberOfArgumentsIsSaidPlainly(t *testing.T) {
	t.Parallel()
	dsn := pgtest.Server.DSN()
	for _, c := range []struct {
		args []string
		want string
	}{
		{[]string{"status", "-dsn", dsn, "extra"}, "pglease status: takes no arguments, got 1\n"},
		{[]string{"release", "-dsn", dsn}, "pglease release: takes one argument, KEY; got 0\n"},
		{[]string{"release", "-dsn", dsn, "a", "b"}, "pglease release: takes one argument, KEY; got 2\n"},
	} {
		r := runCmd(t, c.args...)
		assert.Equal(t, exitUsage, r.code)
		assert.True(t, strings.HasPrefix(r.stderr, c.want), "%v: %q", c.args, r.stderr)
	}
	assert.Equal(t, "takes 2 arguments, FROM TO; got 3", wrongArgs(2, "FROM TO", 3))
}

// closedPort returns a 127.0.0.1 port that nothing listens on.
func closedPort(t *testing.T) int {
	t.Helper()
	ln, err := (&net.ListenConfig{}).Listen(pgtest.Ctx(t), "tcp", "127.0.0.1:0")
	require.NoError(t, err)
	port := ln.Addr().(*net.TCPAddr).Port
	require.NoError(t, ln.Close())
	return port
}

func TestUnreachableDatabaseExitsOneAndNeverPrintsThePassword(t *testing.T) {
	t.Parallel()
	port := closedPort(t)
	const secret = "S3cret-pw-1234"
	for _, dsn := range []string{
		fmt.Sprintf("postgres://ops:%s@127.0.0.1:%d/leases?connect_timeout=5", secret, port),
		fmt.Sprintf("host=127.0.0.1 port=%d user=ops password=%s dbname=leases connect_timeout=5", port, secret),
	} {
		for _, args := range [][]string{{"status"}, {"status", "-json"}, {"migrate"}, {"purge", "-older-than", "1h"}, {"release", "k"}} {
			r := runCmd(t, append(args, "-dsn", dsn)...)
			assert.Equal(t, exitFail, r.code, "%v: %s", args, r.stderr)
			assert.Contains(t, r.stderr, "connecting to ops@127.0.0.1:", args)
			assert.NotContains(t, r.stderr, secret, args)
			assert.Empty(t, r.stdout, args)
		}
	}
	r := runCmd(t, "status", "-dsn", "postgres://ops:"+secret+"@127.0.0.1:notaport/leases")
	assert.Equal(t, exitUsage, r.code)
	assert.NotContains(t, r.stderr, secret, "not even when the string cannot be parsed")
}

func TestMissingTableExitsOneAndSaysHowToCreateIt(t *testing.T) {
	t.Parallel()
	table := pgtest.TableName()
	r := runCmd(t, "status", "-dsn", pgtest.Server.DSN(), "-table", table)
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "pglease migrate -table "+table)
}

func TestRuntimeGrantsAreEnoughForStatusAndReleaseButNotForPurgeOrMigrate(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	role := pgtest.Name("pglease_cli")
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'cli-secret'`, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON %s TO %s`, table, role),
		fmt.Sprintf(`GRANT USAGE ON SEQUENCE %s_fence_seq TO %s`, table, role),
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
	})
	cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	runtimeDSN := fmt.Sprintf("host=%s port=%d user=%s password=cli-secret dbname=%s sslmode=disable",
		cfg.Host, cfg.Port, role, cfg.Database)

	l := pgtest.Locker(t, pool, table, "replica-a")
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	insertRow(t, pool, table, "old", "h", 3*time.Hour, -2*time.Hour)

	as := func(args ...string) result { return runCmd(t, append(args, "-dsn", runtimeDSN, "-table", table)...) }
	r := as("status", "-json")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `"key": "job"`)
	r = as("release", "job")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, fmt.Sprintf("fence %d", lease.Fence()))

	r = as("purge", "-older-than", "1h")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "permission denied")
	assert.Contains(t, r.stderr, "purge DELETE on the table")
	r = as("migrate")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "permission denied")
	assert.NotContains(t, r.stderr, "cli-secret")
}

func TestStatusAndReleaseWorkOnATableWithoutFenceColumn(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.TableName()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL)`, table))
	require.NoError(t, err)
	const ttl = 2 * time.Second
	l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithoutFenceColumn(), pglease.WithTTL(ttl))
	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)

	var rows []statusRow
	require.NoError(t, json.Unmarshal([]byte(ok(t, "status", "-table", table, "-json")), &rows))
	require.Len(t, rows, 1)
	assert.Equal(t, lease.Holder(), rows[0].Holder)
	assert.Nil(t, rows[0].Fence, "no fence column: null")
	assert.Nil(t, rows[0].AcquiredAt, "no acquired_at column: null")
	assert.True(t, rows[0].Live)
	lines := strings.Split(strings.TrimSpace(ok(t, "status", "-table", table)), "\n")
	require.Len(t, lines, 2)
	assert.Equal(t, []string{"job", lease.Holder(), "-", "-"}, strings.Fields(lines[1])[:4])

	out := ok(t, "release", "-table", table, "job")
	assert.Contains(t, out, `revoked key "job"`)
	assert.Contains(t, out, "fence none")
	assert.Contains(t, out, lease.Holder())
	select {
	case <-lease.Done():
	case <-time.After(ttl):
		t.Fatal("the holder did not find its lease lost")
	}
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	_, err = l.Claim(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld, "the revoked holder cannot take its lease back")
	other := pgtest.Locker(t, pool, table, "replica-b", pglease.WithoutFenceColumn())
	_, err = other.Claim(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld, "nobody else either, before its expiry")

	r := runCmd(t, "release", "-now", "-dsn", pgtest.Server.DSN(), "-table", table, "job")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `released key "job"`)
	_, err = other.Claim(ctx, "job")
	require.NoError(t, err, "-now: claimable at once")
}

func TestRevokeLosesTheLeaseAtItsHoldersNextHeartbeatAndNobodyClaimsBeforeItsExpiry(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	lost := make(chan pglease.Event, 10)
	a := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond),
		pglease.WithHook(func(e pglease.Event) {
			if e.Kind == pglease.EventLost {
				lost <- e
			}
		}))
	b := pgtest.Locker(t, pool, table, "replica-b")
	lease, err := a.Claim(ctx, "nightly")
	require.NoError(t, err)

	r := runCmd(t, "release", "-dsn", pgtest.Server.DSN(), "-table", table, "nightly")
	require.Equal(t, exitOK, r.code, r.stderr)
	_, err = b.Claim(ctx, "nightly")
	require.ErrorIs(t, err, pglease.ErrHeld, "nobody can claim a revoked key before its expiry")
	assert.Contains(t, r.stdout, `revoked key "nightly"`)
	assert.Contains(t, r.stdout, fmt.Sprintf("holder %q", a.Holder()))
	assert.Contains(t, r.stdout, fmt.Sprintf("fence %d", lease.Fence()))
	assert.Contains(t, r.stdout, "any holder may claim it from")
	assert.Empty(t, r.stderr)
	revoked, _ := pgtest.ReadRow(t, pool, table, "nightly")
	assert.Equal(t, "pglease:revoked", revoked.Holder)
	assert.Equal(t, lease.Fence(), revoked.Fence, "fence untouched")
	assert.True(t, revoked.Live)

	select {
	case e := <-lost:
		assert.Equal(t, lease.Fence(), e.Fence)
	case <-time.After(2 * time.Second):
		t.Fatal("the holder did not lose the revoked lease at its next heartbeat")
	}
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	_, err = a.Claim(ctx, "nightly")
	require.ErrorIs(t, err, pglease.ErrHeld, "the holder cannot take it back")
	_, err = b.Claim(ctx, "nightly")
	require.ErrorIs(t, err, pglease.ErrHeld)
	after, _ := pgtest.ReadRow(t, pool, table, "nightly")
	assert.Equal(t, revoked, after, "no heartbeat or claim extended or took the revoked row")
	r = runCmd(t, "release", "-dsn", pgtest.Server.DSN(), "-table", table, "nightly")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, "already revoked")

	var taken *pglease.Lease
	require.Eventually(t, func() bool {
		taken, err = b.Claim(ctx, "nightly")
		return err == nil
	}, 10*time.Second, 50*time.Millisecond, "claimable once expired")
	assert.False(t, taken.AcquiredAt().Before(revoked.ExpiresAt), "not before the revoked lease's expiry")
	assert.Greater(t, taken.Fence(), lease.Fence(), "with a greater fence")

	assert.Contains(t, panicMessage(func() { pglease.NewLocker(pool, pglease.WithHolder("pglease:revoked")) }), "reserved")
}

func TestRevokeSaysWhyItCannotWhenTheHolderColumnIsTooShortAndChangesNothing(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.TableName()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (key text PRIMARY KEY, holder varchar(10) NOT NULL, expires_at timestamptz NOT NULL);
		INSERT INTO %[1]s VALUES ('job', 'old-lib-1', clock_timestamp() + interval '1 hour')`, table))
	require.NoError(t, err)

	r := runCmd(t, "release", "-dsn", pgtest.Server.DSN(), "-table", table, "job")
	assert.Equal(t, exitFail, r.code)
	assert.Contains(t, r.stderr, "too short for the revoke marker")
	assert.Contains(t, r.stderr, "release -now")
	var holder string
	var live bool
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT holder, expires_at > clock_timestamp() FROM %s`, table)).Scan(&holder, &live))
	assert.Equal(t, "old-lib-1", holder)
	assert.True(t, live, "nothing changed")

	r = runCmd(t, "release", "-h")
	assert.Equal(t, exitOK, r.code)
	assert.Contains(t, r.stderr, "Revokes the live lease on KEY")
	assert.Contains(t, r.stderr, "-now")
	assert.Contains(t, r.stderr, "UNSAFE")
}

// panicMessage runs f and returns what it panicked with, or "".
func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return ""
}

// A row pinned with expires_at = 'infinity', or expiring past year 9999,
// is shown with the rest: status says the pinned one never expires (in
// JSON: expires_at "infinity", expires_in_seconds null), release revokes
// it saying that nobody can claim it before release -now, and release -now
// then ends it.
func TestStatusAndReleaseShowAndChangeARowPinnedToInfinity(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := migrated(t)
	a := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(10*time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond))
	lease, err := a.Claim(ctx, "pinned")
	require.NoError(t, err)
	insertRow(t, pool, table, "far", "replica-far", time.Hour, time.Hour)
	_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = CASE key WHEN 'pinned' THEN 'infinity'::timestamptz ELSE '20000-01-01 00:00:00+00' END`,
		pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)

	lines := strings.Split(strings.TrimSpace(ok(t, "status", "-table", table)), "\n")
	require.Len(t, lines, 3)
	f := strings.Fields(lines[2])
	require.Len(t, f, 6, lines[2])
	assert.Equal(t, []string{"pinned", a.Holder(), fmt.Sprint(lease.Fence())}, f[:3])
	assert.Equal(t, []string{"never", "live"}, f[4:])
	assert.Equal(t, "live", strings.Fields(lines[1])[5], lines[1])

	var rows []map[string]any
	require.NoError(t, json.Unmarshal([]byte(ok(t, "status", "-table", table, "-json")), &rows))
	require.Len(t, rows, 2)
	assert.Equal(t, "far", rows[0]["key"])
	assert.Equal(t, "20000-01-01T00:00:00Z", rows[0]["expires_at"])
	assert.Equal(t, "pinned", rows[1]["key"])
	assert.Equal(t, "infinity", rows[1]["expires_at"])
	assert.Contains(t, rows[1], "expires_in_seconds")
	assert.Nil(t, rows[1]["expires_in_seconds"], "no number of seconds: it never expires")
	assert.Equal(t, true, rows[1]["live"])

	out := ok(t, "release", "-table", table, "pinned")
	assert.Contains(t, out, `revoked key "pinned"`)
	assert.Contains(t, out, "never expires")
	assert.Contains(t, out, "release -now")
	pgtest.WaitDone(t, lease, 5*time.Second)
	require.ErrorIs(t, lease.Err(), pglease.ErrLost)

	r := runCmd(t, "release", "-now", "-dsn", pgtest.Server.DSN(), "-table", table, "pinned")
	require.Equal(t, exitOK, r.code, r.stderr)
	assert.Contains(t, r.stdout, `released key "pinned"`)
	assert.Contains(t, r.stdout, "was live until infinity")
	assert.Contains(t, r.stderr, "WARNING")
	taken, err := pgtest.Locker(t, pool, table, "replica-b").Claim(ctx, "pinned")
	require.NoError(t, err, "claimable at once after release -now")
	assert.Greater(t, taken.Fence(), lease.Fence())
}
