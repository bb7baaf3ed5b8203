package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Run briefly, in CI for instance:
//
//	go test -run '^$' -fuzz FuzzClaimKey -fuzztime 40000x .
//	go test -run '^$' -fuzz FuzzTableName -fuzztime 4000x .
//
// Without -fuzz, go test runs the seed corpus below.

var keyRejections = []string{"key is empty", "NUL byte", "not valid UTF-8", "longer than the longest a key may be"}

// FuzzClaimKey: a key is either refused with a clear error, writing
// nothing, or it round-trips exactly: claimed, read back by key, released.
func FuzzClaimKey(f *testing.F) {
	for _, seed := range []string{"job", "", "a\x00b", "\xff", "x'); DROP TABLE lease; --", `"quoted"`, "%s%d", "é\u202e",
		"\\", "$1", "💥", strings.Repeat("k", pglease.MaxKeyLen), strings.Repeat("k", pglease.MaxKeyLen+1), " ", "\n\t", "\ufeff"} {
		f.Add(seed)
	}
	pool := pgtest.PoolWith(f, pgtest.Server.DSN(), nil)
	table := pgtest.Name("lease_fuzzkey")
	require.NoError(f, pglease.Migrate(context.Background(), pool, pglease.WithTable(table)))
	l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("fuzz"), pglease.WithLogger(pgtest.Quiet)))
	f.Cleanup(func() { _ = l.Close(context.Background()) })

	f.Fuzz(func(t *testing.T, key string) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		lease, err := l.Claim(ctx, key)
		if err != nil {
			require.Nil(t, lease)
			require.True(t, containsAny(err.Error(), keyRejections), "a refused key gets a clear reason: %v", err)
			require.NotErrorIs(t, err, pglease.ErrHeld)
			if strings.ContainsRune(key, 0) || key == "" || len(key) > pglease.MaxKeyLen || !utf8.ValidString(key) {
				return // cannot even be looked up as text
			}
			var n int
			require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT count(*) FROM %s WHERE key = $1`, pgx.Identifier{table}.Sanitize()), key).Scan(&n))
			require.Zero(t, n, "a refused key writes nothing")
			return
		}
		var stored, holder string
		var fence int64
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT key, holder, fence FROM %s WHERE key = $1`, pgx.Identifier{table}.Sanitize()), key).
			Scan(&stored, &holder, &fence))
		require.Equal(t, key, stored, "the key round-trips byte for byte")
		require.Equal(t, l.Holder(), holder)
		require.Equal(t, lease.Fence(), fence)
		require.NoError(t, lease.Unlock(ctx))
	})
}

// FuzzTableName: a table name is either refused by WithTable (Schema,
// Migrate and NewLocker all say so, and nothing is created), or Migrate
// creates a table under exactly that name, quoted, that a Locker can use.
// It runs in a database of its own, so a fuzzed name cannot touch the
// tables of other tests.
func FuzzTableName(f *testing.F) {
	for _, seed := range []string{"lease", "Lease", "my_lease$1", "s.t", "a.b.c", "", ".", "x.", `x"y`, "x'y", "x;y", "1abc", "$x",
		"é_ß", "ÉTÉ.ÉTÉ", "x y", "select", "public.lease", strings.Repeat("x", 53), strings.Repeat("x", 54), "a\x00", "\xff"} {
		f.Add(seed)
	}
	pool := fuzzDatabase(f)
	f.Fuzz(func(t *testing.T, name string) {
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		_, optErr := pglease.Schema(pglease.WithTable(name))
		if optErr != nil {
			require.Contains(t, optErr.Error(), "WithTable")
			before := countRelations(t, pool)
			require.ErrorContains(t, pglease.Migrate(ctx, pool, pglease.WithTable(name)), "WithTable")
			require.Contains(t, panicMessage(func() { pglease.NewLocker(pool, pglease.WithTable(name)) }), "WithTable")
			require.Equal(t, before, countRelations(t, pool), "a refused name creates nothing")
			return
		}
		parts := strings.Split(name, ".")
		if len(parts) == 2 {
			if strings.HasPrefix(strings.ToLower(parts[0]), "pg_") {
				t.Skip("schemas named pg_* are reserved by PostgreSQL")
			}
			_, err := pool.Exec(ctx, "CREATE SCHEMA IF NOT EXISTS "+pgx.Identifier{parts[0]}.Sanitize())
			require.NoError(t, err)
		}
		defer dropFuzzTable(t, pool, parts)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(name)))
		var found *string
		require.NoError(t, pool.QueryRow(ctx, `SELECT to_regclass($1)::text`, pgx.Identifier(parts).Sanitize()).Scan(&found))
		require.NotNil(t, found, "table %q exists under its quoted name", name)
		l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(name), pglease.WithHolder("fuzz"), pglease.WithLogger(pgtest.Quiet)))
		defer func() { _ = l.Close(context.Background()) }()
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		var fence int64
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT fence FROM %s WHERE key = 'k'`, pgx.Identifier(parts).Sanitize())).Scan(&fence))
		require.Equal(t, lease.Fence(), fence)
		require.NoError(t, lease.Unlock(ctx))
	})
}

func containsAny(s string, subs []string) bool {
	for _, sub := range subs {
		if strings.Contains(s, sub) {
			return true
		}
	}
	return false
}

var fuzzDBOnce sync.Map // fuzz target name -> database name

// fuzzDatabase creates a database for f on the shared server and returns a
// pool on it; the database is dropped at cleanup.
func fuzzDatabase(f *testing.F) *pgxpool.Pool {
	f.Helper()
	ctx := context.Background()
	admin := pgtest.PoolWith(f, pgtest.Server.DSN(), nil)
	name := fmt.Sprintf("%s_%d", pgtest.Name("pglease_fuzz"), time.Now().UnixNano()%1e6)
	_, err := admin.Exec(ctx, "CREATE DATABASE "+pgx.Identifier{name}.Sanitize())
	require.NoError(f, err)
	fuzzDBOnce.Store(f.Name(), name)
	pool := pgtest.PoolWith(f, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.Database = name })
	f.Cleanup(func() {
		pool.Close()
		_, _ = admin.Exec(ctx, "DROP DATABASE IF EXISTS "+pgx.Identifier{name}.Sanitize()+" WITH (FORCE)")
	})
	return pool
}

func countRelations(t *testing.T, db pglease.DB) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(),
		`SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast')`).Scan(&n))
	return n
}

func dropFuzzTable(t *testing.T, db pglease.DB, parts []string) {
	t.Helper()
	seq := append([]string{}, parts...)
	seq[len(seq)-1] += "_fence_seq"
	ctx := context.Background()
	_, err := db.Exec(ctx, "DROP TABLE IF EXISTS "+pgx.Identifier(parts).Sanitize())
	require.NoError(t, err)
	_, err = db.Exec(ctx, "DROP SEQUENCE IF EXISTS "+pgx.Identifier(seq).Sanitize())
	require.NoError(t, err)
	if len(parts) == 2 && !strings.EqualFold(parts[0], "public") {
		_, err = db.Exec(ctx, "DROP SCHEMA IF EXISTS "+pgx.Identifier{parts[0]}.Sanitize())
		var pgErr interface{ SQLState() string }
		if errors.As(err, &pgErr) && pgErr.SQLState() == "2BP01" {
			err = nil // not empty: the schema was there before (information_schema)
		}
		require.NoError(t, err)
	}
}
