package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestInput pins what bad input and durations at the limits of their
// range do: a clear error or panic, and nothing written.
func TestInput(t *testing.T) { //nolint:tparallel // BadInputNamesWhatIsWrong runs alone, comparing whole-table snapshots in turn
	// Bad input of every kind is refused before anything is sent: bad options
	// by every entry point they apply to, with an error that wraps ErrInvalidOption and
	// names the option; bad keys by Claim and Lock, with an error that says
	// what is wrong and does not echo a huge key whole; a nil db with an error
	// or panic saying so; and a nil Context, a programming error in Go's
	// convention, with a panic that says so. The table is left exactly as it
	// was, the Locker stays usable and its held lease untouched, and a key that
	// looks like SQL is only data.
	//
	// Its subtests run one after the other, each comparing the table with the
	// snapshot taken before them; the test is fast, so it does not run in
	// parallel with others either.
	t.Run("BadInputNamesWhatIsWrong", func(t *testing.T) {
		ctx, pool, table := pgtest.Setup(t)
		// A TTL of an hour: no heartbeat moves expires_at while the snapshots
		// are compared.
		l := pgtest.Locker(t, pool, table, "hostile", pglease.WithTTL(time.Hour))
		held, err := l.Claim(ctx, "held")
		require.NoError(t, err)
		before := fullSnapshot(t, pool, table)
		nothingWritten := func(t *testing.T) {
			t.Helper()
			require.Equal(t, before, fullSnapshot(t, pool, table), "nothing written")
		}

		// Each case is refused by every entry point its options apply to (New
		// and NewLocker, Migrate, Schema, NewAdmin), with an error that wraps
		// ErrInvalidOption, names the option and says what is wrong with its
		// value. An entry point an option does not apply to refuses it for
		// that reason (TestOptions checks those errors).
		badOptions := []struct {
			name   string
			opts   []pglease.Option
			option string
			want   string
		}{
			{"TTL zero", []pglease.Option{pglease.WithTTL(0)}, "WithTTL", "WithTTL(0s): TTL must be at least 10ms"},
			{"TTL negative", []pglease.Option{pglease.WithTTL(-time.Second)}, "WithTTL", "WithTTL(-1s)"},
			{"TTL most negative", []pglease.Option{pglease.WithTTL(math.MinInt64)}, "WithTTL", "TTL must be at least 10ms"},
			{"heartbeat half TTL", []pglease.Option{pglease.WithTTL(time.Minute), pglease.WithHeartbeatInterval(30 * time.Second)}, "WithHeartbeatInterval", "must be less than TTL/2"},
			{"heartbeat zero", []pglease.Option{pglease.WithHeartbeatInterval(0)}, "WithHeartbeatInterval", "WithHeartbeatInterval(0s)"},
			{"heartbeat negative", []pglease.Option{pglease.WithHeartbeatInterval(-time.Hour)}, "WithHeartbeatInterval", "interval must be positive"},
			{"min hold over TTL", []pglease.Option{pglease.WithTTL(time.Second), pglease.WithMinHold(2 * time.Second)}, "WithMinHold", "WithMinHold(2s): must not exceed the TTL"},
			{"min hold huge", []pglease.Option{pglease.WithMinHold(math.MaxInt64)}, "WithMinHold", "must not exceed the TTL"},
			{"min hold negative", []pglease.Option{pglease.WithMinHold(-1)}, "WithMinHold", "WithMinHold(-1ns)"},
			{"empty holder", []pglease.Option{pglease.WithHolder("")}, "WithHolder", "WithHolder: holder is empty"},
			{"holder with NUL", []pglease.Option{pglease.WithHolder("a\x00b")}, "WithHolder", "without NUL"},
			{"holder invalid UTF-8", []pglease.Option{pglease.WithHolder("\xc3(")}, "WithHolder", "valid UTF-8"},
			{"empty table", []pglease.Option{pglease.WithTable("")}, "WithTable", "table name is empty"},
			{"three parts", []pglease.Option{pglease.WithTable("a.b.c")}, "WithTable", `want "name" or "schema.name"`},
			{"empty part", []pglease.Option{pglease.WithTable(".lease")}, "WithTable", "empty part"},
			{"injection", []pglease.Option{pglease.WithTable(`lease"; DROP TABLE lease; --`)}, "WithTable", "only letters, digits, _ and $"},
			{"injection in schema", []pglease.Option{pglease.WithTable(`public;DROP TABLE x.t`)}, "WithTable", "only letters, digits, _ and $"},
			{"quote", []pglease.Option{pglease.WithTable(`le'ase`)}, "WithTable", "only letters, digits, _ and $"},
			{"NUL in table", []pglease.Option{pglease.WithTable("t\x00")}, "WithTable", "only letters, digits, _ and $"},
			{"space", []pglease.Option{pglease.WithTable("my lease")}, "WithTable", "only letters, digits, _ and $"},
			{"digit first", []pglease.Option{pglease.WithTable("1lease")}, "WithTable", "no digit or $ first"},
			{"too long", []pglease.Option{pglease.WithTable(strings.Repeat("x", 54))}, "WithTable", "would be truncated"},
			{"invalid UTF-8", []pglease.Option{pglease.WithTable("le\xffase")}, "WithTable", "not valid UTF-8"},
			{"negative retention", []pglease.Option{pglease.WithRetention(-time.Hour)}, "WithRetention", "WithRetention(-1h0m0s)"},
			{"zero retention", []pglease.Option{pglease.WithRetention(0)}, "WithRetention", "WithRetention(0s): retention must be at least 1h0m0s"},
			{"retention below the floor", []pglease.Option{pglease.WithRetention(time.Hour - time.Second)}, "WithRetention", "a shorter purge horizon would let a claim stalled in between issue a fence smaller"},
			{"zero timeout", []pglease.Option{pglease.WithTimeout(0)}, "WithTimeout", "WithTimeout(0s)"},
			{"negative timeout", []pglease.Option{pglease.WithTimeout(-1)}, "WithTimeout", "timeout must be positive"},
			{"nil logger", []pglease.Option{pglease.WithLogger(nil)}, "WithLogger", "WithLogger: logger is nil"},
			{"nil hook", []pglease.Option{pglease.WithHook(nil)}, "WithHook", "WithHook: hook is nil"},
			{"zero Option", []pglease.Option{{}}, "Option", "the zero Option: make options with the With functions"},
		}
		for _, tc := range badOptions {
			t.Run("option "+tc.name, func(t *testing.T) {
				results := entryPointErrors(ctx, pool, table, tc.opts)
				require.NotEmpty(t, results, "the options apply somewhere")
				for ctor, err := range results {
					if strings.Contains(err.Error(), " does not apply to ") && tc.option != "Option" {
						delete(results, ctor)
						continue
					}
					require.ErrorIs(t, err, pglease.ErrInvalidOption, ctor)
					assert.Equal(t, tc.option, pglease.OptionNamed(err), "%s names the option: %v", ctor, err)
					assert.True(t, strings.HasPrefix(err.Error(), "pglease: "), err.Error())
					require.ErrorContains(t, err, tc.want, "%s says what is wrong with the value", ctor)
				}
				require.NotEmpty(t, results, "some entry point takes %s", tc.option)
				nothingWritten(t)
			})
		}
		t.Run("nil db", func(t *testing.T) {
			require.Contains(t, panicMessage(func() { pglease.NewLocker(nil) }), "db is nil")
			var nilPool *pgxpool.Pool
			require.Contains(t, panicMessage(func() { pglease.NewLocker(nilPool) }), "db is nil")
			_, err := pglease.New(nilPool)
			require.ErrorContains(t, err, "db is nil")
			_, err = pglease.NewAdmin(nil)
			require.ErrorContains(t, err, "db is nil")
			require.ErrorContains(t, pglease.Migrate(ctx, nil), "db is nil")
		})

		for _, tc := range []struct{ name, key, want string }{
			{"empty", "", "key is empty"},
			{"NUL byte", "job\x00name", "NUL byte"},
			{"invalid UTF-8", "job\xc3\x28", "not valid UTF-8"},
			{"MaxKeyLen+1 bytes", strings.Repeat("k", pglease.MaxKeyLen+1), "longer than the longest a key may be"},
			{"1 MB of two-byte runes", strings.Repeat("é", 1<<19), "longer than the longest a key may be"},
		} {
			t.Run("key "+tc.name, func(t *testing.T) {
				lease, err := l.Claim(ctx, tc.key)
				require.Nil(t, lease)
				require.ErrorContains(t, err, "pglease: claim")
				require.ErrorContains(t, err, tc.want)
				require.Less(t, len(err.Error()), 300, "a huge key is not echoed whole")
				_, err = l.Lock(ctx, tc.key)
				require.ErrorContains(t, err, tc.want)
				_, ok := l.Held(tc.key)
				require.False(t, ok)
				nothingWritten(t)
			})
		}

		var nilCtx context.Context
		for _, tc := range []struct {
			name string
			call func()
		}{
			{"Claim", func() { _, _ = l.Claim(nilCtx, "nil-ctx") }},
			{"Lock", func() { _, _ = l.Lock(nilCtx, "nil-ctx") }},
			{"Unlock", func() { _ = held.Unlock(nilCtx) }},
			{"Context", func() { held.Context(nilCtx) }},
			{"Migrate", func() { _ = pglease.Migrate(nilCtx, pool, pglease.WithTable(table)) }},
		} {
			t.Run("nil context to "+tc.name, func(t *testing.T) {
				require.Contains(t, strings.ToLower(panicMessage(tc.call)), "context", "panics naming the problem")
				nothingWritten(t)
			})
		}
		require.NoError(t, held.Err(), "the held lease is untouched by all of it")

		// Keys are data, never SQL.
		hostile := `x'); DROP TABLE ` + table + `; --`
		lease, err := l.Claim(ctx, hostile)
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		after := fullSnapshot(t, pool, table)
		require.Equal(t, l.Holder(), after[hostile].Holder)
		delete(after, hostile)
		require.Equal(t, before, after, "nothing but the hostile-but-valid key was written")
		var tables int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE '%DROP%' OR relname LIKE '%lease"%'`).Scan(&tables))
		require.Zero(t, tables, "no table was created from a bad name")
	})

	t.Run("DurationsAtTheLimits", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)

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
				l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("tiny"), pglease.WithLogger(pgtest.Quiet), pglease.WithTTL(ttl)))
				defer func() { _ = l.Close(context.Background()) }()
				_, err := l.Claim(ctx, "tiny")
				t.Logf("TTL %v accepted; Claim: %v", ttl, err)
			})
			require.Contains(t, msg, "WithTTL", "TTL %v is refused naming the option", ttl)
			require.Equal(t, before, fullSnapshot(t, pool, table), "TTL %v: nothing written", ttl)
		}
	})
}

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

// entryPointErrors gives opts to New, NewLocker, Migrate, Schema and
// NewAdmin, on table, and returns each one's error.
func entryPointErrors(ctx context.Context, pool pglease.DB, table string, opts []pglease.Option) map[string]error {
	onTable := append([]pglease.Option{pglease.WithTable(table)}, opts...)
	out := map[string]error{}
	_, out["New"] = pglease.New(pool, onTable...)
	out["NewLocker"] = panicError(func() { pglease.NewLocker(pool, onTable...) })
	out["Migrate"] = pglease.Migrate(ctx, pool, onTable...)
	_, out["Schema"] = pglease.Schema(opts...)
	_, out["NewAdmin"] = pglease.NewAdmin(pool, opts...)
	return out
}

// panicError runs f and returns the error it panicked with, or an error
// saying it did not panic or panicked with something else.
func panicError(f func()) (err error) {
	defer func() {
		switch r := recover().(type) {
		case nil:
		case error:
			err = r
		default:
			err = fmt.Errorf("panicked with a %T, not an error: %v", r, r)
		}
	}()
	f()
	return errors.New("did not panic")
}

func panicMessage(f func()) (msg string) {
	defer func() {
		if r := recover(); r != nil {
			msg = fmt.Sprint(r)
		}
	}()
	f()
	return "did not panic"
}
