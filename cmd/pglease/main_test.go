package main

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// result is what one run of the command gave.
type result struct {
	code           int
	stdout, stderr string
}

// runCmd runs the command in-process, as a shell would run the binary.
func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(pgtest.Ctx(t), args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// ok runs the command against the shared server and requires exit 0.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := runCmd(t, append(args, "-dsn", pgtest.Server.DSN())...)
	require.Equal(t, exitOK, r.code, "pglease %v: stderr: %s", args, r.stderr)
	return r.stdout
}

// migrated returns a fresh table created by `pglease migrate`.
func migrated(t *testing.T) string {
	t.Helper()
	table := pgtest.TableName()
	ok(t, "migrate", "-table", table)
	return table
}

// insertRow writes a row directly, with times relative to the server's
// clock: acquired acquiredAgo ago, expiring expiresIn from now (negative:
// expired that long ago).
func insertRow(t *testing.T, db pglease.DB, table, key, holder string, acquiredAgo, expiresIn time.Duration) {
	t.Helper()
	_, err := db.Exec(context.Background(), fmt.Sprintf(
		`INSERT INTO %s (key, holder, acquired_at, expires_at)
		 VALUES ($1, $2, clock_timestamp() - make_interval(secs => $3), clock_timestamp() + make_interval(secs => $4))`,
		pgx.Identifier{table}.Sanitize()), key, holder, acquiredAgo.Seconds(), expiresIn.Seconds())
	require.NoError(t, err)
}
