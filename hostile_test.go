package pglease_test

import (
	"context"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// fullSnapshot reads every column of every row, to prove a call wrote
// nothing.
func fullSnapshot(t *testing.T, db pglease.DB, table string) map[string]pgtest.Row {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`SELECT key, holder, fence, acquired_at, expires_at FROM %s`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	out := map[string]pgtest.Row{}
	for rows.Next() {
		var key string
		var r pgtest.Row
		require.NoError(t, rows.Scan(&key, &r.Holder, &r.Fence, &r.AcquiredAt, &r.ExpiresAt))
		out[key] = r
	}
	require.NoError(t, rows.Err())
	return out
}

// A nil Context is a programming error (Go's convention): every entry point
// that takes one panics, with a message that says so, before it sends
// anything; the table is left as it was and the Locker stays usable.
func TestHostileInputGetsAClearErrorOrPanicAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	l := pgtest.Locker(t, pool, table, "hostile", pglease.WithTTL(10*time.Second))
	held, err := l.Claim(ctx, "held")
	require.NoError(t, err)
	var nilCtx context.Context

	cases := []struct {
		name      string
		call      func() error
		wantErr   string // the error names the problem
		wantPanic string // or the panic does
	}{
		{"Claim empty key", func() error { _, err := l.Claim(ctx, ""); return err }, "key is empty", ""},
		{"Claim NUL byte", func() error { _, err := l.Claim(ctx, "a\x00b"); return err }, "NUL byte", ""},
		{"Claim invalid UTF-8", func() error { _, err := l.Claim(ctx, "\xff\xfe"); return err }, "not valid UTF-8", ""},
		{"Claim key of MaxKeyLen+1 bytes", func() error { _, err := l.Claim(ctx, strings.Repeat("k", pglease.MaxKeyLen+1)); return err }, "longer than MaxKeyLen", ""},
		{"Claim 1 MB key", func() error { _, err := l.Claim(ctx, strings.Repeat("é", 1<<19)); return err }, "longer than MaxKeyLen", ""},
		{"Lock NUL byte", func() error { _, err := l.Lock(ctx, "\x00"); return err }, "NUL byte", ""},
		{"Lock empty key", func() error { _, err := l.Lock(ctx, ""); return err }, "key is empty", ""},
		{"Claim nil context", func() error { _, err := l.Claim(nilCtx, "nil-ctx"); return err }, "", "context"},
		{"Lock nil context", func() error { _, err := l.Lock(nilCtx, "nil-ctx"); return err }, "", "context"},
		{"Unlock nil context", func() error { return held.Unlock(nilCtx) }, "", "context"},
		{"Context nil parent", func() error { held.Context(nilCtx); return nil }, "", "context"},
		{"Migrate nil context", func() error { return pglease.Migrate(nilCtx, pool, pglease.WithTable(table)) }, "", "context"},
		{"Migrate nil db", func() error { return pglease.Migrate(ctx, nil) }, "db is nil", ""},
		{"Migrate quote in table", func() error { return pglease.Migrate(ctx, pool, pglease.WithTable(`x"y`)) }, "only letters, digits", ""},
		{"Migrate injection in schema", func() error { return pglease.Migrate(ctx, pool, pglease.WithTable(`public;DROP TABLE x.t`)) }, "only letters, digits", ""},
		{"Migrate NUL in table", func() error { return pglease.Migrate(ctx, pool, pglease.WithTable("t\x00")) }, "only letters, digits", ""},
		{"Migrate negative retention", func() error { return pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(-1)) }, "at least MinRetention", ""},
		{"Schema bad table", func() error { _, err := pglease.Schema(pglease.WithTable("a.b.c")); return err }, `want "name" or "schema.name"`, ""},
		{"NewLocker negative TTL", func() error {
			pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithTTL(math.MinInt64))
			return nil
		}, "", "TTL must be at least MinTTL"},
		{"NewLocker negative heartbeat", func() error { pglease.NewLocker(pool, pglease.WithHeartbeatInterval(-time.Hour)); return nil }, "", "interval must be positive"},
		{"NewLocker huge min hold", func() error { pglease.NewLocker(pool, pglease.WithMinHold(math.MaxInt64)); return nil }, "", "must not exceed the TTL"},
		{"NewLocker negative timeout", func() error { pglease.NewLocker(pool, pglease.WithTimeout(-1)); return nil }, "", "timeout must be positive"},
		{"NewLocker invalid UTF-8 holder", func() error { pglease.NewLocker(pool, pglease.WithHolder("\xc3(")); return nil }, "", "valid UTF-8"},
	}
	for _, tc := range cases {
		before := fullSnapshot(t, pool, table)
		var err error
		msg := panicMessage(func() { err = tc.call() })
		if tc.wantPanic != "" {
			require.Contains(t, strings.ToLower(msg), strings.ToLower(tc.wantPanic), "%s: panics naming the problem", tc.name)
		} else {
			require.Equal(t, "did not panic", msg, tc.name)
			require.ErrorContains(t, err, tc.wantErr, tc.name)
			require.Less(t, len(err.Error()), 400, "%s: a huge input is not echoed whole", tc.name)
		}
		require.Equal(t, before, fullSnapshot(t, pool, table), "%s: nothing written", tc.name)
	}
	require.NoError(t, held.Err(), "the held lease is untouched by all of it")
	_, ok := l.Held("\x00")
	require.False(t, ok)
	_, ok = l.Held("")
	require.False(t, ok)
}

func TestCloseWithANilContextLeavesTheLockerClosable(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	// No cleanup Close: if the first Close wedges the Locker, a Close
	// without deadline would hang the test binary.
	l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("h"), pglease.WithLogger(pgtest.Quiet))
	lease, err := l.Claim(ctx, "k")
	require.NoError(t, err)
	var nilCtx context.Context
	msg := panicMessage(func() { _ = l.Close(nilCtx) })
	require.Contains(t, strings.ToLower(msg), "context")
	bounded, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	require.NoError(t, l.Close(bounded), "a Close after the panicking one still releases and returns")
	row, _ := pgtest.ReadRow(t, pool, table, "k")
	require.False(t, row.Live, "the lease was released")
	require.Error(t, lease.Err())
}

func TestHugeDurationsWorkAndSubMicrosecondTTLsAreRefused(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)

	// Durations at the top of the range are valid and behave.
	huge := pgtest.Locker(t, pool, table, "huge", pglease.WithTTL(math.MaxInt64), pglease.WithTimeout(math.MaxInt64))
	lease, err := huge.Claim(ctx, "k")
	require.NoError(t, err)
	require.Greater(t, lease.ExpiresAt().Year(), 2300, "a 292-year lease")
	require.NoError(t, lease.Unlock(ctx))
	require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(math.MaxInt64)))

	// A TTL the database cannot represent (it keeps microseconds), or
	// that gives a heartbeat interval of zero, is a configuration error:
	// it must be refused when the Locker is built, not fail on every claim.
	for _, ttl := range []time.Duration{time.Nanosecond, 2 * time.Nanosecond, time.Microsecond} {
		before := fullSnapshot(t, pool, table)
		msg := panicMessage(func() {
			l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("tiny"), pglease.WithLogger(pgtest.Quiet), pglease.WithTTL(ttl))
			defer func() { _ = l.Close(context.Background()) }()
			_, err := l.Claim(ctx, "tiny")
			t.Logf("TTL %v accepted; Claim: %v", ttl, err)
		})
		require.Contains(t, msg, "WithTTL", "TTL %v is refused naming the option", ttl)
		require.Equal(t, before, fullSnapshot(t, pool, table), "TTL %v: nothing written", ttl)
	}
}
