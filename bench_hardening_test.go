package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// The statements before the hardening that BenchmarkHardeningCost measures,
// kept as they were: the baselines it compares today's statements against.
const (
	// prevClaimSQL and prevReleaseSQL: the claim and the release.
	prevClaimSQL   = sqlstmt.BaselineUnhardenedClaim
	prevReleaseSQL = sqlstmt.BaselineUnhardenedRelease

	// prevHeartbeatSQL is the heartbeat statement before rounds skipped
	// locked rows: one UPDATE that waits on every row it matches.
	prevHeartbeatSQL = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
  FROM unnest($3::text[], $4::bigint[]) AS h(key, fence)
 WHERE l.key = h.key AND l.holder = $1 AND l.fence = h.fence
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`
)

// BenchmarkHardeningCost measures what the statements pay for surviving the
// environments users run, against the statements before (prev*SQL, below),
// alternating cycle by cycle in one run on a durable private server, so
// that the ratio (now/prev) is what to read:
//
//   - claim/default=on: a claim + release cycle with the claim that raises
//     synchronous_commit and reads the clock once, against the previous
//     claim, on a server whose default is on. Nothing should change.
//   - claim/default=off: the same with synchronous_commit = off for the
//     session, as a database or role default would set it. The previous
//     claim then skipped the WAL flush and could be lost in a crash: the
//     ratio is the price of a claim that survives one.
//   - release: a claim + release cycle with the release that skips locked
//     rows (a CTE over arrays, also used by Close), against the previous
//     single-row UPDATE, with the same claim.
//   - heartbeat/leases=N: one round of the heartbeat that skips locked rows
//     and reports them, against the previous plain UPDATE, with no row
//     locked by anyone.
func BenchmarkHardeningCost(b *testing.B) {
	srv := durableServer(b)

	for _, def := range []string{"on", "off"} {
		b.Run("claim/default="+def, func(b *testing.B) {
			pool := hardeningPool(b, srv.DSN(), def)
			table := benchTable(b, pool, "hardening")
			now := []cycle{claimCycle(pool, table, "now", sqlstmt.Claim)}
			prev := []cycle{claimCycle(pool, table, "prev", prevClaimSQL)}
			runInterleaved(b, variant{"now", now}, variant{"prev", prev}, []string{"job"})
		})
	}

	b.Run("release", func(b *testing.B) {
		pool := hardeningPool(b, srv.DSN(), "on")
		table := benchTable(b, pool, "hardening")
		now := []cycle{claimCycle(pool, table, "now", sqlstmt.Claim)}
		prev := []cycle{prevReleaseCycle(pool, table, "prev")}
		runInterleaved(b, variant{"now", now}, variant{"prev", prev}, []string{"job"})
	})

	sizes := []int{10, 1000}
	if testing.Short() {
		sizes = []int{10, 100}
	}
	for _, n := range sizes {
		b.Run(fmt.Sprintf("heartbeat/leases=%d", n), func(b *testing.B) {
			pool := hardeningPool(b, srv.DSN(), "on")
			table := benchTable(b, pool, "hardening")
			keys, fences := seedLeases(b, pool, table, "replica", n)
			round := func(sql string, ttl any) cycle { return roundCycle(pool, sql, table, "replica", ttl, keys, fences) }
			runInterleaved(b, variant{"now", []cycle{round(sqlstmt.Heartbeat, each(n, benchTTL.Seconds()))}},
				variant{"prev", []cycle{round(prevHeartbeatSQL, benchTTL.Seconds())}}, []string{"round"})
		})
	}
}

// hardeningPool connects to dsn with synchronous_commit set to def for every
// session, as ALTER DATABASE or ALTER ROLE ... SET would.
func hardeningPool(b *testing.B, dsn, def string) *pgxpool.Pool {
	b.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(b, err)
	cfg.MaxConns = 2
	cfg.ConnConfig.RuntimeParams["synchronous_commit"] = def
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(b, err)
	b.Cleanup(pool.Close)
	return pool
}

// claimCycle is rawCycle with the claim statement given: claim, then the
// release a Locker sends.
func claimCycle(db pglease.DB, table, holder, claimSQL string) cycle {
	claim := renderSQL(claimSQL, table)
	release := renderSQL(benchReleaseSQL, table)
	ttl := benchTTL.Seconds()
	return func(ctx context.Context, key string) (bool, error) {
		fence, won, err := claimRaw(ctx, db, claim, key, holder, ttl, claimSQL != prevClaimSQL)
		if !won || err != nil {
			return false, err
		}
		return true, releaseRaw(ctx, db, release, holder, key, fence)
	}
}

// releaseRaw sends the release of one lease (sqlstmt.ReleaseOne), and
// again while the row stays locked past its lock wait, as a Locker does (a
// pause doubling from 1ms, at most 20 attempts).
func releaseRaw(ctx context.Context, db pglease.DB, release, holder, key string, fence int64) error {
	pause := time.Millisecond
	for range 20 {
		tag, err := db.Exec(ctx, release, holder, key, fence, 0.0, "20ms")
		var pgErr *pgconn.PgError
		switch {
		case errors.As(err, &pgErr) && pgErr.Code == "55P03":
		case err != nil:
			return err
		case tag.RowsAffected() == 0:
			return fmt.Errorf("release of %q fence %d: lost", key, fence)
		default:
			return nil
		}
		time.Sleep(pause)
		pause = min(2*pause, 50*time.Millisecond)
	}
	return fmt.Errorf("release of %q fence %d: %w", key, fence, errStarved)
}

// errStarved is releaseRaw's error when the row stayed locked by other
// transactions through every attempt: the release gave up, and the row
// lapses at its expiry.
var errStarved = errors.New("row locked by other transactions through 20 attempts")

// prevReleaseCycle is claimCycle with today's claim and the previous
// release statement.
func prevReleaseCycle(db pglease.DB, table, holder string) cycle {
	claim := renderSQL(sqlstmt.Claim, table)
	release := renderSQL(prevReleaseSQL, table)
	ttl := benchTTL.Seconds()
	return func(ctx context.Context, key string) (bool, error) {
		fence, won, err := claimRaw(ctx, db, claim, key, holder, ttl, true)
		if err != nil {
			return false, err
		}
		if !won {
			return false, fmt.Errorf("claim of %q found it held", key)
		}
		_, err = db.Exec(ctx, release, key, holder, fence, 0.0)
		return true, err
	}
}
