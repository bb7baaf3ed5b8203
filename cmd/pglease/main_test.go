package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
)

// server is the one PostgreSQL every test of the package shares; tests
// isolate themselves with a table each.
var server *pgserver.Server

func TestMain(m *testing.M) {
	server = pgserver.ForTestMain(pgserver.Options{})
	os.Exit(server.AfterTests(m.Run()))
}

var tableSeq atomic.Int64

// freshTable names a table no other test uses; it is not created.
func freshTable() string { return fmt.Sprintf("cli_t%d", tableSeq.Add(1)) }

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// result is what one run of the command gave.
type result struct {
	code           int
	stdout, stderr string
}

// runCmd runs the command in-process, as a shell would run the binary.
func runCmd(t *testing.T, args ...string) result {
	t.Helper()
	var out, errOut bytes.Buffer
	code := run(ctxT(t), args, &out, &errOut)
	return result{code, out.String(), errOut.String()}
}

// ok runs the command against the shared server and requires exit 0.
func ok(t *testing.T, args ...string) string {
	t.Helper()
	r := runCmd(t, append(args, "-dsn", server.DSN())...)
	require.Equal(t, exitOK, r.code, "pglease %v: stderr: %s", args, r.stderr)
	return r.stdout
}

// migrated returns a fresh table created by `pglease migrate`.
func migrated(t *testing.T) string {
	t.Helper()
	table := freshTable()
	ok(t, "migrate", "-table", table)
	return table
}

func newPool(t *testing.T) *pgxpool.Pool {
	t.Helper()
	pool, err := pgxpool.New(context.Background(), server.DSN())
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

func newLocker(t *testing.T, db pglease.DB, table, holder string, opts ...pglease.Option) *pglease.Locker {
	t.Helper()
	all := append([]pglease.Option{
		pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(slog.New(slog.DiscardHandler)),
	}, opts...)
	l := pglease.NewLocker(db, all...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
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

// row is a lease row as the server sees it now.
type row struct {
	holder                string
	fence                 int64
	acquiredAt, expiresAt time.Time
	live                  bool
}

func readRow(t *testing.T, db pglease.DB, table, key string) row {
	t.Helper()
	var r row
	require.NoError(t, db.QueryRow(context.Background(), fmt.Sprintf(
		`SELECT holder, fence, acquired_at, expires_at, expires_at > clock_timestamp() FROM %s WHERE key = $1`,
		pgx.Identifier{table}.Sanitize()), key).Scan(&r.holder, &r.fence, &r.acquiredAt, &r.expiresAt, &r.live))
	return r
}
