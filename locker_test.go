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
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestLateReleaseOfPreviousMandateLeavesTheReclaimedLeaseUntouched(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(10*time.Second))

	first, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	second, err := l.Claim(ctx, "job")
	require.NoError(t, err, "a re-entrant claim by the same holder succeeds")
	require.Greater(t, second.Fence(), first.Fence())

	err = first.Unlock(ctx)
	require.ErrorIs(t, err, pglease.ErrLost, "the first mandate's release is late")
	require.ErrorIs(t, first.Err(), pglease.ErrLost)

	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)
	assert.Equal(t, second.Fence(), row.Fence, "the row carries the second mandate's fence")
	assert.True(t, row.Live, "the second mandate's lease is still live")
	assert.Equal(t, second.ExpiresAt().UnixMicro(), row.ExpiresAt.UnixMicro(), "its expiry was not touched")
	held, ok := l.Held("job")
	require.True(t, ok)
	assert.Same(t, second, held)
	require.NoError(t, second.Err())
}

func TestMigrateCreatesTheTableAndSequenceIdempotentlyUnderAnyTableName(t *testing.T) {
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
}

func TestMigrateIsSafeWhenTenReplicasRunItAtOnce(t *testing.T) {
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
}

func TestMigratePurgesOnlyRowsExpiredLongerThanTheRetention(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
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
}

func TestLockerNeedsOnlySelectInsertUpdateAndSequenceUsageAtRunTime(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	role := pgtest.Name("pglease_rt")
	tbl := pgx.Identifier{table}.Sanitize()
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'rt-secret'`, role),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON %s TO %s`, tbl, role),
		fmt.Sprintf(`GRANT USAGE ON SEQUENCE %s TO %s`, pgx.Identifier{table + "_fence_seq"}.Sanitize(), role),
	} {
		_, err := pool.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = pool.Exec(context.Background(), fmt.Sprintf(`DROP OWNED BY %s; DROP ROLE %s`, role, role))
	})
	cfg, err := pgxpool.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	cfg.ConnConfig.User, cfg.ConnConfig.Password = role, "rt-secret"
	rtPool, err := pgxpool.NewWithConfig(ctx, cfg)
	require.NoError(t, err)
	defer rtPool.Close()

	l := pgtest.Locker(t, rtPool, table, "rt", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
	events := pgtest.NewEvents(t)
	l2 := pgtest.Locker(t, rtPool, table, "rt2", pglease.WithHook(events.Hook))
	lease, err := l.Claim(ctx, "k")
	require.NoError(t, err)
	_, err = l2.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld)
	first := lease.ExpiresAt()
	require.Eventually(t, func() bool { return lease.ExpiresAt().After(first) }, 5*time.Second, 20*time.Millisecond, "heartbeat extends")
	require.NoError(t, lease.Unlock(ctx))

	err = pglease.Migrate(ctx, rtPool, pglease.WithTable(table))
	require.Error(t, err, "Migrate needs more than the runtime role has")
	var pgErr *pgconn.PgError
	require.ErrorAs(t, err, &pgErr)
	assert.Equal(t, "42501", pgErr.Code)
	assert.Contains(t, err.Error(), "permission denied")
	assert.Contains(t, err.Error(), "Migrate needs CREATE on the schema")
}

func TestClaimIsOneStatementAndReturnsErrHeldWhileAnotherHolderIsLive(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	counter := &pgtest.Statements{}
	pool := pgtest.Pool(t, counter)
	table := pgtest.Table(t, pool)
	a := pgtest.Locker(t, pool, table, "replica-a")
	b := pgtest.Locker(t, pool, table, "replica-b")

	counter.Reset()
	lease, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	assert.Equal(t, 1, counter.Count("claim"), "one statement")
	assert.Equal(t, 0, counter.Count("other"))
	assert.Equal(t, "replica-a", lease.Holder())
	assert.Equal(t, "job", lease.Key())
	row, _ := pgtest.ReadRow(t, pool, table, "job")
	assert.Equal(t, row.Fence, lease.Fence(), "the fence is the one the database issued")
	assert.Equal(t, row.ExpiresAt.UnixMicro(), lease.ExpiresAt().UnixMicro())

	counter.Reset()
	_, err = b.Claim(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld)
	assert.Contains(t, err.Error(), `claim "job"`)
	assert.Equal(t, 1, counter.Count("claim"))
	after, _ := pgtest.ReadRow(t, pool, table, "job")
	assert.Equal(t, row, after, "a contended claim writes nothing")
	_, ok := b.Held("job")
	assert.False(t, ok)
}

func TestReentrantClaimAdvancesTheFenceAndTheFirstLeaseIsLost(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	l := pgtest.Locker(t, pool, table, "replica-1")
	first, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	jobCtx, cancel := first.Context(ctx)
	defer cancel()

	second, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	require.Greater(t, second.Fence(), first.Fence())
	pgtest.WaitDone(t, first, time.Second)
	require.ErrorIs(t, first.Err(), pglease.ErrLost)
	<-jobCtx.Done()
	require.ErrorIs(t, context.Cause(jobCtx), pglease.ErrLost, "the job of the first mandate is told")
	require.NoError(t, second.Err())
}

func TestFenceOnlyGrowsAcrossHoldersReclaimsReleasesAndPurge(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	a := pgtest.Locker(t, pool, table, "a")
	b := pgtest.Locker(t, pool, table, "b")
	var last int64
	grows := func(lease *pglease.Lease, err error) *pglease.Lease {
		t.Helper()
		require.NoError(t, err)
		require.Greater(t, lease.Fence(), last)
		last = lease.Fence()
		return lease
	}
	grows(a.Claim(ctx, "k"))
	grows(a.Claim(ctx, "k")) // re-entrant
	x := grows(a.Claim(ctx, "k"))
	require.NoError(t, x.Unlock(ctx))
	x = grows(b.Claim(ctx, "k")) // another holder after a release
	require.NoError(t, x.Unlock(ctx))
	x = grows(b.Claim(ctx, "k"))
	require.NoError(t, x.Unlock(ctx))

	// Purge the expired row, then claim the key again: the fence must not
	// restart. The row is backdated past the shortest purge horizon.
	_, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET acquired_at = acquired_at - interval '2 hours', expires_at = expires_at - interval '2 hours'`,
		pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(pglease.MinRetention)))
	_, ok := pgtest.ReadRow(t, pool, table, "k")
	require.False(t, ok, "purged")
	grows(a.Claim(ctx, "k"))
}

func TestUnlockExpiresTheRowInPlaceAndNeverDeletesIt(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	counter := &pgtest.Statements{}
	pool := pgtest.Pool(t, counter)
	table := pgtest.Table(t, pool)
	a := pgtest.Locker(t, pool, table, "a")
	b := pgtest.Locker(t, pool, table, "b")
	lease, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	counter.Reset()
	require.NoError(t, lease.Unlock(ctx))
	assert.Equal(t, 1, counter.Count("release"), "one statement")
	assert.Equal(t, 0, counter.Count("other"), "no DELETE")
	row, ok := pgtest.ReadRow(t, pool, table, "k")
	require.True(t, ok, "the row is still there")
	assert.False(t, row.Live)
	assert.Equal(t, "a", row.Holder)
	assert.Equal(t, lease.Fence(), row.Fence)
	require.ErrorIs(t, lease.Err(), pglease.ErrReleased)
	select {
	case <-lease.Done():
	default:
		t.Fatal("Done is not closed after Unlock")
	}
	require.NoError(t, lease.Unlock(ctx), "Unlock again returns the first outcome")

	next, err := b.Claim(ctx, "k")
	require.NoError(t, err, "another holder claims at once")
	require.Greater(t, next.Fence(), lease.Fence())
}

func TestUnlockWithMinHoldKeepsTheLeaseUntilAcquiredPlusMinHold(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	const minHold = 2 * time.Second
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(10*time.Second), pglease.WithMinHold(minHold))
	b := pgtest.Locker(t, pool, table, "b")
	lease, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))
	row, _ := pgtest.ReadRow(t, pool, table, "k")
	assert.Equal(t, lease.AcquiredAt().Add(minHold).UnixMicro(), row.ExpiresAt.UnixMicro(), "expires at acquired_at + min hold")
	assert.True(t, row.Live)

	_, err = b.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "another replica cannot run the same tick")
	again, err := a.Claim(ctx, "k")
	require.NoError(t, err, "the holder itself re-claims")
	require.NoError(t, again.Unlock(ctx))

	// Once the min hold has passed, the release has expired it.
	var wait time.Duration
	require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf(`SELECT GREATEST(expires_at - clock_timestamp(), '0'::interval) FROM %s WHERE key = 'k'`, pgx.Identifier{table}.Sanitize())).Scan(&wait))
	time.Sleep(wait + 10*time.Millisecond) // server-measured remaining hold, not a guess
	_, err = b.Claim(ctx, "k")
	require.NoError(t, err)
}

func TestUnlockReleasesEvenWhenItsContextIsAlreadyCancelled(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	l := pgtest.Locker(t, pool, table, "a")
	lease, err := l.Claim(pgtest.Ctx(t), "k")
	require.NoError(t, err)
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	require.NoError(t, lease.Unlock(cancelled), "released as gocron does during Shutdown")
	row, _ := pgtest.ReadRow(t, pool, table, "k")
	assert.False(t, row.Live)
}

func TestClaimThatWaitedOnTheRowLockLongerThanTheTTLHandsOutNothing(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	const ttl = 500 * time.Millisecond
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))

	// Another transaction holds the row lock for longer than the TTL.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'k' FOR UPDATE`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)

	type result struct {
		lease *pglease.Lease
		err   error
	}
	done := make(chan result, 1)
	go func() {
		lease, err := b.Claim(ctx, "k")
		done <- result{lease, err}
	}()
	// Wait until the claim is queued on the row lock, then past its TTL.
	require.Eventually(t, func() bool {
		var waiting bool
		_ = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%')`).Scan(&waiting)
		return waiting
	}, 10*time.Second, 10*time.Millisecond)
	time.Sleep(2 * ttl) // the point of the test: a wait longer than the TTL
	require.NoError(t, tx.Commit(ctx))

	r := <-done
	require.Error(t, r.err)
	require.Nil(t, r.lease, "no lease is handed out")
	var pgErr *pgconn.PgError
	require.False(t, errors.As(r.err, &pgErr) && pgErr.Code == "23514", "no CHECK violation: %v", r.err)
	require.ErrorIs(t, r.err, pglease.ErrLost)
	_, ok := b.Held("k")
	require.False(t, ok)

	next, err := b.Claim(ctx, "k")
	require.NoError(t, err, "the next claim works")
	require.Greater(t, next.Fence(), first.Fence())
}

func TestConcurrentClaimsOfOneKeyHaveOneWinningHolderPerRoundAndGrowingFences(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	lockers := make([]*pglease.Locker, 5)
	for i := range lockers {
		lockers[i] = pgtest.Locker(t, pool, table, fmt.Sprintf("holder-%d", i))
	}
	var last int64
	for round := range 10 {
		type win struct {
			holder string
			lease  *pglease.Lease
		}
		var (
			mu   sync.Mutex
			wins []win
			wg   sync.WaitGroup
		)
		start := make(chan struct{})
		for g := range 20 {
			l := lockers[g%5]
			wg.Go(func() {
				<-start
				lease, err := l.Claim(ctx, "hot")
				if err != nil {
					assert.ErrorIs(t, err, pglease.ErrHeld)
					return
				}
				mu.Lock()
				wins = append(wins, win{l.Holder(), lease})
				mu.Unlock()
			})
		}
		close(start)
		wg.Wait()
		require.NotEmpty(t, wins, "round %d: someone wins", round)
		newest := wins[0].lease
		for _, w := range wins {
			require.Equal(t, wins[0].holder, w.holder, "round %d: one holder wins", round)
			require.Greater(t, w.lease.Fence(), last, "round %d: fences grow", round)
			if w.lease.Fence() > newest.Fence() {
				newest = w.lease
			}
		}
		for _, w := range wins {
			if w.lease != newest {
				pgtest.WaitDone(t, w.lease, time.Second)
				require.ErrorIs(t, w.lease.Err(), pglease.ErrLost, "older re-entrant mandates of the round are lost")
			}
		}
		row, _ := pgtest.ReadRow(t, pool, table, "hot")
		require.Equal(t, newest.Fence(), row.Fence)
		last = newest.Fence()
		require.NoError(t, newest.Unlock(ctx))
	}
}

func TestCloseReleasesEveryLeaseStopsTheHeartbeatAndIsIdempotent(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
	var leases []*pglease.Lease
	for i := range 3 {
		lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	cancelled, cancel := context.WithCancel(ctx)
	cancel()
	require.NoError(t, l.Close(cancelled), "Close releases even with a cancelled context")
	for _, lease := range leases {
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
		row, _ := pgtest.ReadRow(t, pool, table, lease.Key())
		assert.False(t, row.Live, "%s released", lease.Key())
		require.NoError(t, lease.Unlock(ctx), "Unlock after Close is a no-op")
	}
	require.NoError(t, l.Close(ctx), "idempotent")
	_, err := l.Claim(ctx, "k0")
	require.ErrorIs(t, err, pglease.ErrClosed)
	// goleak in TestMain proves the heartbeat goroutine is gone.
}

func TestBadInputNamesWhatIsWrongAndWritesNothing(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	seed := pgtest.Locker(t, pool, table, "seed")
	_, err := seed.Claim(ctx, "existing")
	require.NoError(t, err)
	before := snapshotTable(t, pool, table)

	// Each case is refused by NewLocker and by Migrate, with an error that
	// wraps ErrInvalidOption and names the option; where the option applies
	// (a Locker's, the schema's, or both) the error also says what is wrong
	// with its value, and where it does not, that it does not apply.
	const locker, schema, both = 1, 2, 3
	badOptions := []struct {
		name    string
		opts    []pglease.Option
		option  string
		applies int
		want    string
	}{
		{"TTL zero", []pglease.Option{pglease.WithTTL(0)}, "WithTTL", locker, "WithTTL(0s): TTL must be at least MinTTL (10ms)"},
		{"TTL negative", []pglease.Option{pglease.WithTTL(-time.Second)}, "WithTTL", locker, "WithTTL(-1s)"},
		{"heartbeat half TTL", []pglease.Option{pglease.WithTTL(time.Minute), pglease.WithHeartbeatInterval(30 * time.Second)}, "WithHeartbeatInterval", locker, "must be less than TTL/2"},
		{"heartbeat zero", []pglease.Option{pglease.WithHeartbeatInterval(0)}, "WithHeartbeatInterval", locker, "WithHeartbeatInterval(0s)"},
		{"min hold over TTL", []pglease.Option{pglease.WithTTL(time.Second), pglease.WithMinHold(2 * time.Second)}, "WithMinHold", locker, "WithMinHold(2s): must not exceed the TTL"},
		{"min hold negative", []pglease.Option{pglease.WithMinHold(-1)}, "WithMinHold", locker, "WithMinHold(-1ns)"},
		{"empty holder", []pglease.Option{pglease.WithHolder("")}, "WithHolder", locker, "WithHolder: holder is empty"},
		{"holder with NUL", []pglease.Option{pglease.WithHolder("a\x00b")}, "WithHolder", locker, "without NUL"},
		{"empty table", []pglease.Option{pglease.WithTable("")}, "WithTable", both, "table name is empty"},
		{"three parts", []pglease.Option{pglease.WithTable("a.b.c")}, "WithTable", both, `want "name" or "schema.name"`},
		{"empty part", []pglease.Option{pglease.WithTable(".lease")}, "WithTable", both, "empty part"},
		{"injection", []pglease.Option{pglease.WithTable(`lease"; DROP TABLE lease; --`)}, "WithTable", both, "only letters, digits, _ and $"},
		{"quote", []pglease.Option{pglease.WithTable(`le'ase`)}, "WithTable", both, "only letters, digits, _ and $"},
		{"space", []pglease.Option{pglease.WithTable("my lease")}, "WithTable", both, "only letters, digits, _ and $"},
		{"digit first", []pglease.Option{pglease.WithTable("1lease")}, "WithTable", both, "no digit or $ first"},
		{"too long", []pglease.Option{pglease.WithTable(strings.Repeat("x", 54))}, "WithTable", both, "would be truncated"},
		{"invalid UTF-8", []pglease.Option{pglease.WithTable("le\xffase")}, "WithTable", both, "not valid UTF-8"},
		{"negative retention", []pglease.Option{pglease.WithRetention(-time.Hour)}, "WithRetention", schema, "WithRetention(-1h0m0s)"},
		{"zero retention", []pglease.Option{pglease.WithRetention(0)}, "WithRetention", schema, "WithRetention(0s): retention must be at least MinRetention (1h0m0s)"},
		{"retention below the floor", []pglease.Option{pglease.WithRetention(pglease.MinRetention - time.Second)}, "WithRetention", schema, "a shorter purge horizon would let a claim stalled in between issue a fence smaller"},
		{"zero timeout", []pglease.Option{pglease.WithTimeout(0)}, "WithTimeout", locker, "WithTimeout(0s)"},
		{"nil logger", []pglease.Option{pglease.WithLogger(nil)}, "WithLogger", locker, "WithLogger: logger is nil"},
		{"nil hook", []pglease.Option{pglease.WithHook(nil)}, "WithHook", locker, "WithHook: hook is nil"},
		{"nil option", []pglease.Option{nil}, "Option", both, "nil Option"},
	}
	for _, tc := range badOptions {
		t.Run(tc.name, func(t *testing.T) {
			opts := append([]pglease.Option{pglease.WithTable(table)}, tc.opts...)
			for _, c := range []struct {
				ctor string
				is   int
				err  error
			}{
				{"NewLocker", locker, panicError(func() { pglease.NewLocker(pool, opts...) })},
				{"Migrate", schema, pglease.Migrate(ctx, pool, opts...)},
			} {
				require.ErrorIs(t, c.err, pglease.ErrInvalidOption, c.ctor)
				var oe *pglease.OptionError
				require.ErrorAs(t, c.err, &oe, c.ctor)
				assert.Equal(t, tc.option, oe.Option, "%s names the option: %v", c.ctor, c.err)
				assert.True(t, strings.HasPrefix(c.err.Error(), "pglease: "), c.err.Error())
				if tc.applies&c.is != 0 {
					assert.ErrorContains(t, c.err, tc.want, "%s says what is wrong with the value", c.ctor)
				} else {
					assert.ErrorContains(t, c.err, tc.option+" does not apply to", "%s refuses an option it would ignore", c.ctor)
				}
			}
		})
	}
	// Valid options given where they would do nothing are refused too.
	for _, tc := range []struct {
		name, option string
		err          error
	}{
		{"retention given to a Locker", "WithRetention", panicError(func() { pglease.NewLocker(pool, pglease.WithRetention(pglease.MinRetention)) })},
		{"leader key given to a Locker", "WithLeaderKey", panicError(func() { pglease.NewLocker(pool, pglease.WithLeaderKey("leader")) })},
		{"min hold given to an Elector", "WithMinHold", panicError(func() { pglease.NewElector(pool, pglease.WithMinHold(time.Second)) })},
		{"TTL given to Migrate", "WithTTL", pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithTTL(time.Minute))},
		{"hook given to Schema", "WithHook", func() error { _, err := pglease.Schema(pglease.WithHook(func(pglease.Event) {})); return err }()},
	} {
		var oe *pglease.OptionError
		require.ErrorAs(t, tc.err, &oe, tc.name)
		assert.Equal(t, tc.option, oe.Option, tc.name)
		assert.ErrorIs(t, tc.err, pglease.ErrInvalidOption, tc.name)
		assert.ErrorContains(t, tc.err, tc.option+" does not apply to", tc.name)
	}

	require.Contains(t, panicMessage(func() { pglease.NewLocker(nil) }), "db is nil")
	var nilPool *pgxpool.Pool
	require.Contains(t, panicMessage(func() { pglease.NewLocker(nilPool) }), "db is nil")
	require.ErrorContains(t, pglease.Migrate(ctx, nil), "db is nil")

	l := pgtest.Locker(t, pool, table, "bad-keys")
	for name, key := range map[string]string{
		"empty":        "",
		"NUL":          "job\x00name",
		"invalid UTF8": "job\xc3\x28",
		"1 MB":         strings.Repeat("k", 1<<20),
	} {
		lease, err := l.Claim(ctx, key)
		require.Error(t, err, name)
		require.Nil(t, lease, name)
		require.Contains(t, err.Error(), "pglease: claim", name)
		require.Less(t, len(err.Error()), 300, "%s: a huge key is not echoed whole", name)
		_, err = l.Lock(ctx, key)
		require.Error(t, err, name)
	}

	// Keys are data, never SQL.
	hostile := `x'); DROP TABLE ` + table + `; --`
	lease, err := l.Claim(ctx, hostile)
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))
	before[hostile] = pgtest.Row{Holder: "bad-keys", Fence: lease.Fence()}

	after := snapshotTable(t, pool, table)
	require.Len(t, after, len(before), "nothing but the hostile-but-valid key was written")
	for key, row := range before {
		require.Equal(t, row.Holder, after[key].Holder, key)
		require.Equal(t, row.Fence, after[key].Fence, key)
	}
	var tables int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_class WHERE relname LIKE '%DROP%' OR relname LIKE '%lease"%'`).Scan(&tables))
	require.Zero(t, tables, "no table was created from a bad name")
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

// snapshotTable reads holder and fence of every row.
func snapshotTable(t *testing.T, db pglease.DB, table string) map[string]pgtest.Row {
	t.Helper()
	rows, err := db.Query(context.Background(), fmt.Sprintf(`SELECT key, holder, fence FROM %s`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	out := map[string]pgtest.Row{}
	for rows.Next() {
		var key string
		var r pgtest.Row
		require.NoError(t, rows.Scan(&key, &r.Holder, &r.Fence))
		out[key] = r
	}
	require.NoError(t, rows.Err())
	return out
}

func TestClaimWhoseRoundTripOutlastsTheTrustWindowHandsOutNothing(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	db := pgtest.NewFaultyDB(pool)
	const ttl = 300 * time.Millisecond
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
	open := db.Hold("claim") // the claim is on its way longer than the TTL
	claimed := make(chan error, 1)
	go func() {
		_, err := l.Claim(ctx, "k")
		claimed <- err
	}()
	<-db.Entered
	time.Sleep(ttl) // the point of the test: a round trip longer than the trust window
	open()
	err := <-claimed
	require.ErrorIs(t, err, pglease.ErrLost)
	require.ErrorContains(t, err, "longer than the trust window")
	_, ok := l.Held("k")
	require.False(t, ok, "no lease is handed out")
	assert.Zero(t, events.Count(pglease.EventAcquired))
	again, err := l.Claim(ctx, "k")
	require.NoError(t, err, "the holder takes its row back at once")
	require.NoError(t, again.Err())
}
