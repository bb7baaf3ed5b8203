package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// PgBouncer in transaction pooling mode hands each transaction to any of
// its server connections, and outside a transaction block every Sync of the
// extended protocol ends one. Nothing may rely on session state: pglease's
// statements are single statements or one transaction (Migrate). What the
// client must choose is how pgx sends them:
//
//   - simple_protocol, exec and cache_describe send each statement in one
//     round trip with one Sync: they work.
//   - describe_exec parses the unnamed statement, syncs, then binds it: the
//     Bind may reach another server connection, whose unnamed statement is
//     another client's ("bind message supplies 3 parameters, but prepared
//     statement "" requires 4", SQLSTATE 08P01). It does not work, and
//     max_prepared_statements does not help: it tracks named statements.
//   - cache_statement, pgx's default, prepares named statements on one
//     server connection and runs them on any ("prepared statement
//     "stmtcache_..." already exists", 42P05, or "does not exist"): it needs
//     PgBouncer 1.21+ with max_prepared_statements.
//
// TestPgBouncer pins that the Locker, its heartbeat, releases, the Elector
// and Migrate work through it in the modes that work.
func TestPgBouncer(t *testing.T) {
	t.Parallel()
	t.Run("TransactionPooling", func(t *testing.T) {
		t.Parallel()
		for _, m := range bouncerModes(t) {
			t.Run(m.name, func(t *testing.T) {
				t.Parallel()
				ctx := pgtest.Ctx(t)
				b := pgbouncer.New(t, pgtest.Server.DSN(), m.opts)
				pool := bouncedPool(t, b, m.mode)
				table := pgtest.Table(t, pool) // Migrate, through the pooler
				require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)), "and again: idempotent")

				const ttl = time.Second
				opts := []pglease.Option{pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200 * time.Millisecond)}
				events := pgtest.NewEvents(t)
				a := pgtest.Locker(t, pool, table, "a", append(opts, pglease.WithHook(events.Hook))...)
				other := pgtest.Locker(t, pool, table, "b", opts...)

				keys := []string{"k1", "k2", "k3", "k4", "k5"}
				leases := make([]*pglease.Lease, len(keys))
				for i, key := range keys {
					lease, err := a.Claim(ctx, key)
					require.NoError(t, err)
					leases[i] = lease
					_, err = other.Claim(ctx, key)
					require.ErrorIs(t, err, pglease.ErrHeld)
				}

				// The heartbeat keeps every lease across several TTLs.
				select {
				case <-leases[0].Done():
					t.Fatalf("lease lost through the pooler: %v", leases[0].Err())
				case <-time.After(3 * ttl):
				}
				assert.GreaterOrEqual(t, events.Count(pglease.EventExtended), 10, "heartbeat rounds in 3 TTLs")
				for i, lease := range leases {
					require.NoError(t, lease.Err())
					row, ok := pgtest.ReadRow(t, pool, table, keys[i])
					require.True(t, ok)
					require.True(t, row.Live)
					require.Equal(t, lease.Fence(), row.Fence)
					_, err := other.Claim(ctx, keys[i])
					require.ErrorIs(t, err, pglease.ErrHeld)
				}

				// Unlock releases at once; the other Locker takes the key over.
				require.NoError(t, leases[0].Unlock(ctx))
				next, err := other.Claim(ctx, keys[0])
				require.NoError(t, err)
				require.Greater(t, next.Fence(), leases[0].Fence())

				// Close releases the rest, and stops the heartbeat.
				require.NoError(t, a.Close(ctx))
				for i, lease := range leases[1:] {
					require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
					row, _ := pgtest.ReadRow(t, pool, table, keys[i+1])
					require.False(t, row.Live, "released by Close")
				}
				require.NoError(t, other.Close(ctx))

				concurrentClaimsSeeOnlyContention(t, pool, table)

				// An Elector elects one leader and hands over on Close.
				e1 := newElector(t, pool, pglease.DefaultLeaderKey, append(opts, pglease.WithTable(table), pglease.WithHolder("e1"), pglease.WithLogger(pgtest.Quiet)))
				e2 := newElector(t, pool, pglease.DefaultLeaderKey, append(opts, pglease.WithTable(table), pglease.WithHolder("e2"), pglease.WithLogger(pgtest.Quiet)))
				require.NoError(t, e1.IsLeader(ctx))
				require.ErrorIs(t, e2.IsLeader(ctx), pglease.ErrHeld)
				first, ok := e1.Leader()
				require.True(t, ok)
				require.NoError(t, e1.Close(ctx))
				require.NoError(t, e2.IsLeader(ctx), "leadership handed over on Close, without waiting for the TTL")
				second, ok := e2.Leader()
				require.True(t, ok)
				require.Greater(t, second.Fence(), first.Fence())
				require.NoError(t, e2.Close(ctx))
			})
		}
	})

	// FollowerWithAListenConnectionWakesByNotification: behind PgBouncer a
	// follower with WithListenDSN LISTENs on a direct connection, so that it
	// sends next to nothing while it waits and takes over at the release,
	// long before the leader's lease would have lapsed.
	t.Run("FollowerWithAListenConnectionWakesByNotification", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
		pool := bouncedPool(t, b, pgx.QueryExecModeExec)
		counted, table := followerPool(t, b), pgtest.Table(t, pool)
		leader, _ := bouncedElector(t, pool, table, "leader")
		require.NoError(t, leader.IsLeader(ctx))
		follower, fl := bouncedElector(t, counted.pool, table, "follower", pglease.WithListenDSN(pgtest.Server.DSN()))
		require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
		require.Eventually(t, func() bool { m, _ := follower.WaitMode(); return m == pglease.WaitByNotification },
			10*time.Second, 5*time.Millisecond, "waiting by notification through PgBouncer")
		pid := pglease.ListenerPID(fl)
		require.NotZero(t, pid)

		// While it waits, only the safety net (2.5s to 5s) sends anything.
		counted.stmts.Reset()
		time.Sleep(3 * time.Second)
		sent := counted.total()
		require.LessOrEqual(t, sent, 6, "statements of a follower waiting by notification for 3s")

		first, ok := leader.Leader()
		require.True(t, ok)
		released := time.Now()
		require.NoError(t, leader.Close(ctx))
		require.Eventually(t, func() bool { _, ok := follower.Leader(); return ok }, 2*time.Second, time.Millisecond,
			"taken over at the release's notification, not at the lease's expiry in %v", bouncedTTL)
		next, _ := follower.Leader()
		require.Greater(t, next.Fence(), first.Fence())
		t.Logf("taken over %v after the release; %d statements in 3s of waiting", time.Since(released).Round(time.Millisecond), sent)

		// Close closes the listening connection.
		require.NoError(t, fl.Close(ctx))
		require.Eventually(t, func() bool {
			var n int
			err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
			return err == nil && n == 0
		}, 5*time.Second, 10*time.Millisecond, "the listening connection closed by Close")
	})

	// PollingIsBounded: without WithListenDSN a follower behind PgBouncer
	// polls, trying about once per MaxPollInterval: a claim and a read.
	t.Run("PollingIsBounded", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
		pool := bouncedPool(t, b, pgx.QueryExecModeExec)
		counted, table := followerPool(t, b), pgtest.Table(t, pool)
		events := pgtest.NewEvents(t)
		leader, _ := bouncedElector(t, pool, table, "leader")
		require.NoError(t, leader.IsLeader(ctx))
		follower, _ := bouncedElector(t, counted.pool, table, "follower", pglease.WithHook(events.Hook))
		require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
		ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		for !strings.Contains(ev.Err.Error(), "did not arrive") {
			ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		}
		require.Contains(t, ev.Err.Error(), "WithListenDSN", "the fix")
		require.Contains(t, ev.Err.Error(), pglease.MaxPollInterval.String(), "the poll period")

		// Its backoff has grown to MaxPollInterval in the probe's 2s.
		const window = 5 * time.Second
		counted.stmts.Reset()
		time.Sleep(window)
		sent, claims := counted.total(), counted.stmts.Count("claim")
		t.Logf("%d statements (%d claims) in %v of polling", sent, claims, window)
		attempts := int(window / pglease.MaxPollInterval)
		require.LessOrEqual(t, claims, attempts+1, "at most one claim per MaxPollInterval")
		require.LessOrEqual(t, sent, 2*(attempts+1), "a claim and a read per attempt")
		require.GreaterOrEqual(t, claims, attempts/2, "it still polls")
	})

	// ContractRunGoesThroughIt keeps -pooler honest: with
	// it, the pools of the contract tests connect to the PgBouncer, not to the
	// server.
	t.Run("ContractRunGoesThroughIt", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		cfg := pool.Config().ConnConfig
		srv, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		if pgtest.ThroughPooler() {
			require.NotEqual(t, srv.Port, cfg.Port, "with -pooler the test pools connect to the PgBouncer")
			require.Equal(t, pgx.QueryExecModeExec, cfg.DefaultQueryExecMode)
		} else {
			require.Equal(t, srv.Port, cfg.Port)
		}
		var one int
		require.NoError(t, pool.QueryRow(pgtest.Ctx(t), `SELECT 1`).Scan(&one))
	})
}

// bouncedTTL is the TTL of the leaders of TestPgBouncer's waiting
// subtests: far longer than any of their bounds, so that only a release
// can hand the key over.
const bouncedTTL = 30 * time.Second

// bouncedElector is an Elector on the default leader key of table, its
// Locker on db, both closed at cleanup.
func bouncedElector(t *testing.T, db pglease.DB, table, holder string, opts ...pglease.Option) (*pglease.Elector, *pglease.Locker) {
	t.Helper()
	l := pgtest.Locker(t, db, table, holder, append([]pglease.Option{pglease.WithTTL(bouncedTTL)}, opts...)...)
	e, err := pglease.NewElector(l, pglease.DefaultLeaderKey)
	require.NoError(t, err)
	t.Cleanup(func() { _ = e.Close(context.Background()) })
	return e, l
}

// countedPool is a pool through a PgBouncer whose statements are counted.
type countedPool struct {
	pool  *pgxpool.Pool
	stmts *pgtest.Statements
}

// followerPool is a pool through b in exec mode that counts its statements.
func followerPool(t *testing.T, b *pgbouncer.Bouncer) countedPool {
	t.Helper()
	stmts := &pgtest.Statements{}
	pool := pgtest.PoolWith(t, b.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		cfg.ConnConfig.Tracer = stmts
		cfg.MaxConns = 4
	})
	return countedPool{pool, stmts}
}

// total is every statement counted since the last Reset.
func (c countedPool) total() int {
	n := 0
	for _, kind := range []string{"claim", "heartbeat", "release", "other"} {
		n += c.stmts.Count(kind)
	}
	return n
}

// bouncerModes are the pgx exec modes tested through PgBouncer, with the
// PgBouncer settings each needs.
func bouncerModes(t *testing.T) []struct {
	name string
	mode pgx.QueryExecMode
	opts pgbouncer.Options
} {
	t.Helper()
	_, version, err := pgbouncer.Find()
	if err != nil {
		t.Fatal(err)
	}
	// Fewer server connections than the client pool has: transactions of
	// one client connection do land on different server connections.
	base := pgbouncer.Options{PoolMode: "transaction", PoolSize: 3}
	modes := []struct {
		name string
		mode pgx.QueryExecMode
		opts pgbouncer.Options
	}{
		{"simple_protocol", pgx.QueryExecModeSimpleProtocol, base},
		{"exec", pgx.QueryExecModeExec, base},
		{"cache_describe", pgx.QueryExecModeCacheDescribe, base},
	}
	if pgbouncer.AtLeast(version, 1, 21) {
		prepared := base
		prepared.MaxPreparedStatements = 100
		modes = append(modes, struct {
			name string
			mode pgx.QueryExecMode
			opts pgbouncer.Options
		}{"cache_statement_with_max_prepared_statements", pgx.QueryExecModeCacheStatement, prepared})
	} else {
		t.Logf("PgBouncer %v is older than 1.21: pgx's default statement cache is not covered (needs max_prepared_statements)", version)
	}
	return modes
}

// bouncedPool is a pool through b in exec mode, with more client
// connections than b has server connections. Closed at cleanup.
func bouncedPool(t *testing.T, b *pgbouncer.Bouncer, mode pgx.QueryExecMode) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolWith(t, b.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.MaxConns = 8
	})
}

// concurrentClaimsSeeOnlyContention runs Lockers side by side on one key
// each and on one shared key, with a fast heartbeat, so that statements of
// different client connections interleave on the pooler's few server
// connections: every error must be ErrHeld, and no lease may be lost.
func concurrentClaimsSeeOnlyContention(t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	events := pgtest.NewEvents(t)
	var (
		wg     sync.WaitGroup
		claims claimTally
	)
	for i := range 6 {
		l := pgtest.Locker(t, pool, table, fmt.Sprintf("c%d", i), pglease.WithTTL(2*time.Second),
			pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
		wg.Go(func() {
			for n := 0; n < 60; n++ {
				key := "shared"
				if n%2 == 0 {
					key = fmt.Sprintf("own-%d", i)
				}
				claims.claim(ctx, l, key)
			}
			claims.fail(l.Close(ctx))
		})
	}
	wg.Wait()
	claims.check(t)
	require.Zero(t, events.Count(pglease.EventLost), "leases lost")
}

// claimTally counts claims made side by side and keeps every error other
// than ErrHeld, the only one contention may cause.
type claimTally struct {
	mu   sync.Mutex
	runs int
	errs []error
}

// claim claims key with l and releases it at once.
func (c *claimTally) claim(ctx context.Context, l *pglease.Locker, key string) {
	lease, err := l.Claim(ctx, key)
	if err == nil {
		err = lease.Unlock(ctx)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.runs++
	if err != nil && !errors.Is(err, pglease.ErrHeld) {
		c.errs = append(c.errs, fmt.Errorf("%s: %w", key, err))
	}
}

// fail keeps err, if any.
func (c *claimTally) fail(err error) {
	if err != nil {
		c.mu.Lock()
		defer c.mu.Unlock()
		c.errs = append(c.errs, err)
	}
}

// check fails the test if any claim failed otherwise than by contention.
func (c *claimTally) check(t *testing.T) {
	t.Helper()
	c.mu.Lock()
	defer c.mu.Unlock()
	require.Empty(t, c.errs, "of %d claims", c.runs)
}
