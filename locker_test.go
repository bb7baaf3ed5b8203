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
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

func TestLateReleaseOfPreviousMandateLeavesTheReclaimedLeaseUntouched(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
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
	ctx, pool, table := pgtest.Setup(t)
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

func TestClaimIsOneStatementAndReturnsErrHeldWhileAnotherHolderIsLive(t *testing.T) {
	t.Parallel()
	ctx, pool, table, counter := pgtest.SetupCounted(t)
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
	ctx, pool, table := pgtest.Setup(t)
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
	ctx, pool, table := pgtest.Setup(t)
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
	ctx, pool, table, counter := pgtest.SetupCounted(t)
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
	ctx, pool, table := pgtest.Setup(t)
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
	ctx, pool, table := pgtest.Setup(t)
	const ttl = 500 * time.Millisecond
	a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))

	// Another transaction holds the row lock for longer than the TTL.
	tx := pgtest.LockRows(t, pool, table, `key = 'k'`)

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
	ctx, pool, table := pgtest.Setup(t)
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
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond)))
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

func TestClaimWhoseRoundTripOutlastsTheTrustWindowHandsOutNothing(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
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

// Guarantee: a claim that may have written the row ends the Locker's
// previous lease of the key, whatever its exit: here a job's re-entrant
// claim with a TTL far shorter than the lease it supersedes commits, and
// its reply is lost, and the network stays down for the heartbeat. The
// previous lease must not stay trusted while its row could lapse at the
// short TTL and go to another holder.
func TestReentrantClaimWhoseReplyIsLostEndsThePreviousLeaseBeforeTheKeyCanGoElsewhere(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	faulty := pgtest.NewFaultyDB(pool)
	wire := pgtest.NewWire(t, faulty)
	a := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(60*time.Second), pglease.WithHeartbeatInterval(time.Second))
	b := pgtest.Locker(t, pool, table, "b")
	pglease.SetCoalescing(a, false)
	short, err := a.Job(pglease.WithTTL(3 * time.Second))
	require.NoError(t, err)

	long, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	claim := wire.Arm(pgtest.Kind("claim"), pgtest.LoseReply)
	_, err = short.Claim(ctx, "job")
	require.Error(t, err, "the reply was lost")
	<-claim.Ran
	faulty.SetFail("heartbeat", errors.New("read tcp: connection reset by peer"))

	deadline := time.Now().Add(8 * time.Second)
	for time.Now().Before(deadline) {
		trusted := long.Err() == nil
		other, err := b.Claim(ctx, "job")
		if err == nil {
			require.False(t, trusted, "b claimed the key (fence %d) while a still trusted its lease (fence %d)", other.Fence(), long.Fence())
			require.NoError(t, other.Unlock(ctx))
			break
		}
		require.ErrorIs(t, err, pglease.ErrHeld)
		time.Sleep(100 * time.Millisecond)
	}
	require.Error(t, long.Err(), "the previous lease ended: its row carries another fence")
}

// Guarantee: Close ends or waits for every claim in flight, and holds
// nothing when it returns: a claim whose statement has committed but whose
// reply is still on its way when Close runs must not outlive Close, or its
// release would run on a pool the caller has closed by then, and the row
// would stay live a whole TTL with nobody holding it.
func TestCloseWaitsForTheClaimInFlightAndLeavesNoLiveRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	wire := pgtest.NewWire(t, pool)
	l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))
	pglease.SetCoalescing(l, false)

	claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
	claimed := make(chan error, 1)
	go func() {
		_, err := l.Claim(ctx, "job")
		claimed <- err
	}()
	<-claim.Hit
	<-claim.Ran // committed; the reply is held

	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	select {
	case err := <-closed:
		// The claim has returned (its goroutine reports it just after);
		// its reply is still held, so it can only have returned because
		// Close ended it.
		select {
		case claimErr := <-claimed:
			t.Logf("Close: %v; the claim in flight: %v", err, claimErr)
		case <-time.After(5 * time.Second):
			t.Fatal("Close returned while a claim was in flight")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("Close did not return within 10s")
	}
	claim.Deliver()
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)
	require.False(t, row.Live, "Close returned and left a live row nobody holds: %+v", row)
}

// Guarantee: a claim that finds another holder's live lease costs a read:
// no row lock, no transaction id, no WAL, so no flush at its commit, alone
// or in a burst; a winning claim writes as before.
func TestLosingClaimTakesNoTransactionIDAndWritesNoWAL(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	holder := pgtest.Locker(t, pool, table, "holder")
	_, err := holder.Claim(ctx, "job")
	require.NoError(t, err)
	tbl := pgx.Identifier{table}

	// cost runs stmt in a transaction of its own and reads whether it got
	// a transaction id and how much WAL it wrote (EXPLAIN ANALYZE's WAL
	// counters count the statement alone, whatever other sessions do).
	cost := func(stmt string, args ...any) (xid bool, walBytes int64, rows int) {
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		defer func() { require.NoError(t, tx.Rollback(ctx)) }()
		var plan []map[string]any
		require.NoError(t, tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+stmt, args...).Scan(&plan))
		top := plan[0]["Plan"].(map[string]any)
		require.NoError(t, tx.QueryRow(ctx, `SELECT pg_current_xact_id_if_assigned() IS NOT NULL`).Scan(&xid))
		return xid, int64(top["WAL Bytes"].(float64)), int(top["Actual Rows"].(float64))
	}
	claim := sqlstmt.Render(sqlstmt.Claim, tbl)
	claimAll := sqlstmt.Render(sqlstmt.ClaimAll, tbl)

	xid, wal, _ := cost(claim, "job", "loser", 60.0)
	assert.False(t, xid, "a losing claim got a transaction id")
	assert.Zero(t, wal, "a losing claim wrote WAL")
	xid, wal, _ = cost(claimAll, "loser", []float64{60, 60}, []string{"job", "job2"}, "500ms")
	assert.True(t, xid, "a burst that wins one key writes it")
	assert.Positive(t, wal)
	_, err = holder.Claim(ctx, "job2")
	require.NoError(t, err)
	xid, wal, _ = cost(claimAll, "loser", []float64{60, 60}, []string{"job", "job2"}, "500ms")
	assert.False(t, xid, "a burst that loses every key got a transaction id")
	assert.Zero(t, wal, "a burst that loses every key wrote WAL")
	xid, wal, _ = cost(claim, "free", "loser", 60.0)
	assert.True(t, xid, "a winning claim writes its row")
	assert.Positive(t, wal)
}
