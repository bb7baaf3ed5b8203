package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sort"
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
	"github.com/pglease/pglease/internal/sqlstmt"
)

// requireNoLiveRowOf fails unless every key's row is absent, expired, or
// carries the holder of no Locker named holder, within limit (a give-back may run just
// after its caller returned).
func requireNoLiveRowOf(t *testing.T, pool pglease.DB, table, holder string, limit time.Duration, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var live []pgtest.Row
		for _, key := range keys {
			if row, ok := pgtest.ReadRow(t, pool, table, key); ok && row.Live && strings.HasPrefix(row.Holder, holder+"#") {
				live = append(live, row)
			}
		}
		if len(live) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d row(s) of %q still live %v after their claims failed, held by nobody: %+v", len(live), holder, limit, live)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// freeRow leaves key's row in table free (claimed by another holder and
// expired in place), so that a claim of key waits only on a row lock.
func freeRow(ctx context.Context, t *testing.T, pool pglease.DB, table, key string) {
	t.Helper()
	other := pgtest.Locker(t, pool, table, "other")
	held, err := other.Claim(ctx, key)
	require.NoError(t, err)
	require.NoError(t, held.Unlock(ctx))
}

// lockFreeRows frees each key's row in table (freeRow) and takes its row
// lock in a transaction of its own, until the test ends: a claim of one of
// them then waits on that lock.
func lockFreeRows(ctx context.Context, t *testing.T, pool pglease.DB, table string, keys ...string) {
	t.Helper()
	for _, key := range keys {
		freeRow(ctx, t, pool, table, key)
		end := pgtest.LockRow(t, pool, table, key)
		t.Cleanup(func() { end(false) })
	}
}

// givenUpAsRowLocksEnd claims 10 free keys of table, each with the
// Locker locker(i) of holder "claimer" (its statements under application
// name app) while another transaction holds the key's row lock, which ends
// as the claim's context does: each claim either returns its lease or the
// context's error, and then no statement of it runs on and its holder has
// no live row.
func givenUpAsRowLocksEnd(ctx context.Context, t *testing.T, pool pglease.DB, table, app string, locker func(i int) *pglease.Locker) {
	t.Helper()
	for i := range 10 {
		key := fmt.Sprintf("job-%d", i)
		freeRow(ctx, t, pool, table, key)
		l := locker(i)
		end := pgtest.LockRow(t, pool, table, key)
		cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		stop := context.AfterFunc(cctx, func() { end(true) })
		lease, err := l.Claim(cctx, key)
		cancel()
		stop()
		end(true)
		if err == nil {
			require.NoError(t, lease.Unlock(ctx))
			continue
		}
		require.ErrorIs(t, err, context.DeadlineExceeded)
		require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
			5*time.Second, 10*time.Millisecond, "a claim statement still runs on the server")
		requireNoLiveRowOf(t, pool, table, "claimer", 0, key)
	}
}

// testSameHolderNeverBothHold gives two Lockers, each on a pool of its own,
// one WithHolder value (two processes of one service): whatever the first
// holds, the second is refused by Claim, Lock, a waiting claim, a burst and
// an Elector, and the first's leases stay its own. fenced chooses a table
// of Migrate or one WithoutFenceColumn (legacyTable).
func testSameHolderNeverBothHold(t *testing.T, fenced bool) {
	t.Helper()
	t.Parallel()
	ctx := pgtest.Ctx(t)
	var a, b *pglease.Locker
	var table string
	var pool *pgxpool.Pool
	// waitRefused hears of each refused attempt of the second Locker's
	// waiting claim.
	waitRefused := make(chan struct{}, 1)
	hook := pglease.WithHook(func(ev pglease.Event) {
		if ev.Kind == pglease.EventContended && ev.Key == "wait" {
			select {
			case waitRefused <- struct{}{}:
			default:
			}
		}
	})
	if fenced {
		pool = pgtest.Pool(t, nil)
		table = pgtest.Table(t, pool)
		a = pgtest.Locker(t, pool, table, "replica")
		b = pgtest.Locker(t, pgtest.Pool(t, nil), table, "replica", hook)
	} else {
		var dsn string
		table, dsn = legacyTable(t, legacyColumns)
		pool = pgtest.PoolAt(t, dsn, nil)
		a = pgtest.Locker(t, pool, table, "replica", pglease.WithoutFenceColumn())
		b = pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, "replica", pglease.WithoutFenceColumn(), hook)
	}
	// The first Locker holds a key for each way of the second to claim it.
	keys := []string{"claim", "lock", "wait", "burst-1", "burst-2"}
	var held []*pglease.Lease
	for _, key := range keys {
		lease, err := a.Claim(ctx, key)
		require.NoError(t, err)
		held = append(held, lease)
	}

	_, err := b.Claim(ctx, "claim")
	require.ErrorIs(t, err, pglease.ErrHeld, "Claim")
	_, err = b.Lock(ctx, "lock")
	require.ErrorIs(t, err, pglease.ErrHeld, "Lock")
	// The waiting claim is refused, then ends with its context: its
	// error says both.
	waitCtx, cancel := context.WithCancel(ctx)
	go func() {
		defer cancel()
		select {
		case <-waitRefused:
		case <-waitCtx.Done():
		case <-time.After(10 * time.Second):
		}
	}()
	_, err = b.ClaimWait(waitCtx, "wait")
	cancel()
	require.ErrorIs(t, err, pglease.ErrHeld, "a waiting claim waits")
	require.ErrorIs(t, err, context.Canceled, "a waiting claim waits")
	if fenced { // without a fence column, claims go one by one
		leases, errs := pglease.ClaimBurst(ctx, b, []string{"burst-1", "burst-2", "free"})
		require.ErrorIs(t, errs[0], pglease.ErrHeld, "a burst")
		require.ErrorIs(t, errs[1], pglease.ErrHeld, "a burst")
		require.NoError(t, errs[2], "a burst takes the free key")
		require.NoError(t, leases[2].Unlock(ctx))
	}

	leader, err := pglease.NewElector(a, "leader")
	require.NoError(t, err)
	follower, err := pglease.NewElector(b, "leader")
	require.NoError(t, err)
	require.NoError(t, leader.IsLeader(ctx))
	require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld, "one leader")
	require.NoError(t, leader.IsLeader(ctx), "the first leader still leads")

	read := pgtest.ReadRow
	if !fenced {
		read = readLegacyRow
	}
	for _, l := range held {
		require.NoError(t, l.Err(), "%s is still the first Locker's", l.Key())
		row, ok := read(t, pool, table, l.Key())
		require.True(t, ok)
		assert.Equal(t, []any{l.Holder(), l.Fence()}, []any{row.Holder, row.Fence}, "%s: the row is the first Locker's mandate", l.Key())
		assert.True(t, strings.HasPrefix(row.Holder, "replica"), "the row names the configured holder: %q", row.Holder)
	}
}

// testSameHolderInTwoVersions gives a Locker of the previous version
// (StoredHolder: the holder stored as it was given) and one of
// this version, each on a pool of its own, one WithHolder value: whatever
// either holds, the other is refused by Claim, Lock, a burst and an
// Elector. fenced chooses a table of Migrate or one WithoutFenceColumn.
func testSameHolderInTwoVersions(t *testing.T, fenced bool) {
	t.Helper()
	t.Parallel()
	ctx := pgtest.Ctx(t)
	var opts []pglease.Option
	var table string
	var pool, other *pgxpool.Pool
	read := pgtest.ReadRow
	if fenced {
		pool, other = pgtest.Pool(t, nil), pgtest.Pool(t, nil)
		table = pgtest.Table(t, pool)
	} else {
		var dsn string
		table, dsn = legacyTable(t, legacyColumns)
		pool, other = pgtest.PoolAt(t, dsn, nil), pgtest.PoolAt(t, dsn, nil)
		opts, read = []pglease.Option{pglease.WithoutFenceColumn()}, readLegacyRow
	}
	old := pgtest.Locker(t, pool, table, "replica", append(opts, pglease.StoredHolder("replica"))...)
	current := pgtest.Locker(t, other, table, "replica", opts...)
	versions := map[string]*pglease.Locker{"previous": old, "current": current}
	for first, second := range map[string]string{"previous": "current", "current": "previous"} {
		a, b := versions[first], versions[second]
		var held []*pglease.Lease
		for _, key := range []string{"claim", "lock", "burst"} {
			lease, err := a.Claim(ctx, first+"-"+key)
			require.NoError(t, err)
			held = append(held, lease)
		}
		_, err := b.Claim(ctx, first+"-claim")
		require.ErrorIs(t, err, pglease.ErrHeld, "Claim by the %s version of the %s version's lease", second, first)
		_, err = b.Lock(ctx, first+"-lock")
		require.ErrorIs(t, err, pglease.ErrHeld, "Lock by the %s version of the %s version's lease", second, first)
		if fenced { // without a fence column, claims go one by one
			_, errs := pglease.ClaimBurst(ctx, b, []string{first + "-burst", first + "-claim"})
			require.ErrorIs(t, errs[0], pglease.ErrHeld, "a burst of the %s version", second)
			require.ErrorIs(t, errs[1], pglease.ErrHeld, "a burst of the %s version", second)
		}
		leader, err := pglease.NewElector(a, first+"-leader")
		require.NoError(t, err)
		follower, err := pglease.NewElector(b, first+"-leader")
		require.NoError(t, err)
		require.NoError(t, leader.IsLeader(ctx))
		require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld, "one leader: the %s version's", first)
		for _, l := range held {
			require.NoError(t, l.Err(), "%s is still the %s version's", l.Key(), first)
			row, ok := read(t, pool, table, l.Key())
			require.True(t, ok)
			assert.Equal(t, []any{l.Holder(), l.Fence()}, []any{row.Holder, row.Fence}, "%s: the row is the %s version's mandate", l.Key(), first)
		}
	}
}

// TestClaim pins what a claim leaves on the server: a commit that waits
// for the WAL flush only when it takes a row, and, when the claim fails,
// times out or is abandoned in flight, nothing live that nobody holds.
func TestClaim(t *testing.T) {
	t.Parallel()
	// Guarantee: every claim of a closed Locker (Claim, Lock, a job's, a
	// job of ticks', its context live or ended) returns ErrClosed, its
	// error naming the key and "locker closed" once, and is reported in
	// one EventClaimFailed carrying that error and the claim's context; a
	// nil context panics, naming it, and reports nothing.
	t.Run("FailuresOnAClosedLockerAreReportedOnce", testClaimFailuresOnAClosedLocker)
	t.Run("CommitSettingOfEveryForm", testClaimCommitSetting)
	t.Run("CommitSettingUnderPresets", testClaimCommitSettingUnderPresets)
	t.Run("LaterClaimInATransactionKeepsTheFlush", testClaimsInOneTransaction)
	t.Run("BurstsSurviveACrash", testBurstClaimsSurviveACrash)
	// Guarantee: two Lockers given one WithHolder never both hold a key: the
	// second gets ErrHeld, as any other holder would.
	t.Run("SameHolderInTwoLockersNeverBothHold", func(t *testing.T) { testSameHolderNeverBothHold(t, true) })
	// Guarantee: during a rolling deploy, a replica of the previous version and
	// one of this version given one WithHolder never both hold a key.
	t.Run("SameHolderInTwoVersionsNeverBothHold", func(t *testing.T) { testSameHolderInTwoVersions(t, true) })
	// Guarantee: a claim sent alone whose reply is held until its caller gives
	// up gives its row back before it returns.
	t.Run("CancelledInFlightGivesItsRowBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

		cctx, cancel := context.WithCancel(ctx)
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		go func() {
			<-claim.Hit
			cancel()
		}()
		_, err := l.Claim(cctx, "job")
		require.Error(t, err)
		require.ErrorIs(t, err, context.Canceled)
		requireNoLiveRowOf(t, pool, table, "a", 0, "job")
	})

	// Guarantee: a claim whose caller gives up while its statement waits on
	// a row lock, the lock ending at that moment, either returns its lease
	// or leaves no live row: its statement is cancelled on the server and
	// its answer read, not left to commit after its caller returned (read
	// too early, such a row could not be given back).
	for _, burst := range []bool{false, true} {
		t.Run(fmt.Sprintf("GivenUpAsARowLockEnds/burst=%v", burst), func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			app := pgtest.AppName("givenup")
			l := pgtest.Locker(t, pgtest.AppPool(t, "", nil, app), table, "claimer")
			pglease.SetCoalesceAll(l, burst)
			givenUpAsRowLocksEnd(ctx, t, pool, table, app, func(int) *pglease.Locker { return l })
		})
	}

	// Guarantee: a claim whose context ends while its statement is in flight
	// gives back what that statement committed, also when the claim was queued
	// in a burst and every caller of the burst gave up.
	t.Run("AbandonedBurstGivesItsRowsBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

		keys := []string{"k1", "k2"}
		cctx, cancel := context.WithCancel(ctx)
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		send := pglease.PrepareClaimBurst([]context.Context{cctx, cctx}, l, keys)
		out := make(chan []error, 1)
		go func() {
			_, errs := send()
			out <- errs
		}()
		<-claim.Hit
		cancel()
		errs := <-out
		for i, err := range errs {
			require.ErrorIs(t, err, context.Canceled, "claim of %q", keys[i])
		}
		<-claim.Ran
		// The key turn is handed to the orphan's give-back: a second claim of
		// the key by another holder tells whether the key is free.
		requireNoLiveRowOf(t, pool, table, "a", 3*time.Second, keys...)
		b := pgtest.Locker(t, pool, table, "b")
		for _, key := range keys {
			_, err := b.Claim(ctx, key)
			require.NoError(t, err, "the key %q stays locked by a row nobody holds", key)
		}
	})

	// Guarantee: Lock "claims key within the Locker's timeout", and a claim that
	// fails hands out nothing. A claim waits on the row lock of a guarded
	// transaction; Lock's timeout cancels it on the client, but pgx only drops
	// the connection: the server keeps the statement waiting on the lock, and
	// once the guarded transaction ends it takes the key for a holder that was
	// told it failed. Nobody holds the Lease, nobody heartbeats or releases it,
	// and every replica is refused the key for the claimer's whole TTL.
	t.Run("TimedOutOnAGuardedRowTakesNothingLater", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTimeout(300*time.Millisecond)) // TTL 60s
		c := pgtest.Locker(t, pool, table, "c")

		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		tx := guardedTx(t, pool, lease)

		_, err = b.Lock(ctx, "job")
		require.Error(t, err)
		t.Logf("b's Lock: %v", err)
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, 'ON CONFLICT') > 0`).Scan(&waiting))
		t.Logf("claims still waiting on the server after Lock returned: %d", waiting)
		require.Eventually(t, func() bool { r, _ := pgtest.ReadRow(t, pool, table, "job"); return !r.Live }, 5*time.Second, 10*time.Millisecond,
			"a's row lapses while guarded")
		require.NoError(t, tx.Commit(ctx)) // the guarded writes land; the key is free

		// Give a cancelled statement every chance to land.
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			r, _ := pgtest.ReadRow(t, pool, table, "job")
			if r.Holder == b.Holder() {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling the row, bounded above
		}
		r, _ := pgtest.ReadRow(t, pool, table, "job")
		t.Logf("row after the guarded commit: %+v", r)
		_, held := b.Held("job")
		assert.False(t, held)
		_, err = c.Claim(ctx, "job")
		assert.NoError(t, err, "the key is nobody's lease, yet a claim is refused")
	})

	// Guarantee: never two holders trusting a lease of one key at once, on a
	// pool of one connection whose claims wait on a locked row while the
	// heartbeat needs the connection.
	t.Run("PoolOfOneNeverTrustsTwoHolders", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) { c.MaxConns = 1 })
		other := pgtest.Pool(t, nil)
		table := pgtest.Table(t, other)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second))
		b := pgtest.Locker(t, other, table, "b", pglease.WithTTL(2*time.Second))

		held, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = a.Claim(ctx, "locked")
		require.NoError(t, err)
		blocker := pgtest.LockRows(t, other, table, "key = $1", "locked")
		claimed := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			_, err := a.Claim(cctx, "locked")
			claimed <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			trusted := held.Err() == nil
			ls, err := b.Claim(ctx, "job")
			if err == nil {
				require.False(t, trusted, "b claimed job (fence %d) while a still trusted fence %d", ls.Fence(), held.Fence())
				stillTrusted := held.Err() == nil
				require.False(t, stillTrusted, "a trusts job after b claimed it")
				break
			}
			require.ErrorIs(t, err, pglease.ErrHeld)
			time.Sleep(20 * time.Millisecond)
		}
		require.NoError(t, blocker.Rollback(ctx))
		err = <-claimed
		t.Logf("re-entrant claim of the locked row: %v; job lease: %v", err, held.Err())
	})

	// WaitsForTheWALFlushOnlyWhenItTakesARow reads the synchronous_commit a
	// claim statement leaves for its commit: the session's setting, raised to
	// on from off or local, when the claim takes a row (its acknowledgement
	// must survive a crash, and a stronger setting is the operator's), and off
	// when it takes none (a claim that only read, or locked a row it then lost,
	// has nothing worth a flush). Each form of the claim: alone, in a burst,
	// and without a fence column.
	t.Run("WaitsForTheWALFlushOnlyWhenItTakesARow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tbl := pgx.Identifier{table}
		holder := pgtest.Locker(t, pool, table, "holder")
		_, err := holder.Claim(ctx, "held")
		require.NoError(t, err)

		forms := map[string]func(key string) (string, []any){
			"Claim": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.Claim, tbl), []any{key, "claimer", 60.0}
			},
			"ClaimAll": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.ClaimAll, tbl), []any{"claimer", []float64{60}, []string{key}, "500ms"}
			},
			"UnfencedClaim": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.UnfencedClaimFor(true), tbl), []any{key, "claimer#0123456789abcdef", 60.0, "claimer#", nil}
			},
		}
		n := 0
		for name, form := range forms {
			for _, c := range []struct{ session, taken, lost string }{
				{"on", "on", "off"},
				{"off", "on", "off"},
				{"local", "on", "off"},
				{"remote_write", "remote_write", "off"},
				{"remote_apply", "remote_apply", "off"},
			} {
				for _, take := range []bool{true, false} {
					key, want := "held", c.lost
					if take {
						n++
						key, want = fmt.Sprintf("free-%d", n), c.taken
					}
					sql, args := form(key)
					got, setting := claimInTx(t, pool, []string{"synchronous_commit", c.session}, sql, args...)
					if take {
						require.Equal(t, 1, got, "%s of a free key took no row", name)
					} else {
						require.Zero(t, got, "%s of a held key took a row", name)
					}
					require.Equal(t, want, setting, "%s with the session at %s, taking a row: %v", name, c.session, take)
				}
			}
		}
	})

	// Guarantee: a claim is one statement, and a claim of a key another holder
	// holds live returns ErrHeld.
	t.Run("OneStatementErrHeldWhileAnotherHolds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		a := pgtest.Locker(t, pool, table, "replica-a")
		b := pgtest.Locker(t, pool, table, "replica-b")

		counter.Reset()
		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		assert.Equal(t, 1, counter.Count("claim"), "one statement")
		assert.Equal(t, 0, counter.Count("other"))
		assert.Equal(t, a.Holder(), lease.Holder())
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
	})

	// Guarantee: a holder claiming its own live key again takes a greater fence,
	// and its first lease is lost.
	t.Run("ReentrantAdvancesTheFence", func(t *testing.T) {
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
	})

	// Guarantee: the fence of a key only grows, across holders, re-claims,
	// releases and a purge.
	t.Run("FenceOnlyGrows", func(t *testing.T) {
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
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table), pglease.WithRetention(time.Hour)))
		_, ok := pgtest.ReadRow(t, pool, table, "k")
		require.False(t, ok, "purged")
		grows(a.Claim(ctx, "k"))
	})

	// Guarantee: concurrent claims of one key have one winning holder per round,
	// each with a greater fence.
	t.Run("OneWinnerPerRound", func(t *testing.T) {
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
	})

	// Guarantee: a claim that waited on the row lock longer than its TTL hands
	// out no lease.
	t.Run("WaitPastTheTTLHandsOutNothing", func(t *testing.T) {
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
	})

	// Guarantee: a claim whose round trip outlasts its trust window hands out no
	// lease.
	t.Run("RoundTripPastTheTrustWindowHandsOutNothing", func(t *testing.T) {
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
	})

	// Guarantee: a claim that may have written the row ends the Locker's
	// previous lease of the key, whatever its exit: here a job's re-entrant
	// claim with a TTL far shorter than the lease it supersedes commits, and
	// its reply is lost, and the network stays down for the heartbeat. The
	// previous lease must not stay trusted while its row could lapse at the
	// short TTL and go to another holder.
	t.Run("LostReentrantReplyEndsThePreviousLease", func(t *testing.T) {
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
	})

	// Guarantee: a re-claim whose outcome is unknown ends the previous
	// lease, though the statement may never have reached the server; the
	// row then still carries the previous lease's fence, and that lease's
	// Unlock expires it, so that another holder takes the key at once, not
	// at the row's expiry.
	t.Run("UnknownReentrantClaimLeavesThePreviousRowToItsUnlock", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		faulty := pgtest.NewFaultyDB(pool)
		a := pgtest.Locker(t, faulty, table, "a", pglease.WithTTL(time.Minute))
		b := pgtest.Locker(t, pool, table, "b")

		prev, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		faulty.SetFail("claim", errors.New("write tcp: connection reset by peer"))
		_, err = a.Claim(ctx, "job")
		require.ErrorContains(t, err, "connection reset by peer")
		faulty.SetFail("claim", nil)
		require.ErrorIs(t, prev.Err(), pglease.ErrLost, "the re-claim may have written the row")
		_, err = b.Claim(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld, "the row still carries the previous lease")

		require.ErrorIs(t, prev.Unlock(ctx), pglease.ErrLost)
		next, err := b.Claim(ctx, "job")
		require.NoError(t, err, "the previous lease's Unlock expired its row")
		require.Greater(t, next.Fence(), prev.Fence())
	})

	// Guarantee: a claim that finds another holder's live lease costs a read:
	// no row lock, no transaction id, no WAL, so no flush at its commit, alone
	// or in a burst; a winning claim writes as before.
	t.Run("LosingWritesNoWAL", func(t *testing.T) {
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
	})
	// Guarantee: a claim whose commit's wait for a synchronous standby was
	// cut short (its caller gave up, a cancel request ended the wait, the
	// server reported success with a WARNING) is no lease, alone or through
	// Lock's timeout, on every kind of DB; its row is given back, and it
	// returns within its documented bounds.
	t.Run("UnreplicatedCommitIsNotALease", testClaimUnreplicated)
	// Guarantee: a claim that finds the key held commits without waiting
	// for a synchronous standby: it answers ErrHeld during a partition.
	t.Run("LosingClaimDoesNotWaitForAStandby", testLosingClaimUnreplicated)
	// Guarantee: a claim whose caller gave up while its commit still ran
	// on the server (here waiting for a synchronous standby), through a
	// DB that cannot cancel it, is given back once that commit ends: the
	// Locker's read of the row waits for the transaction holding it.
	t.Run("ClaimStillCommittingIsGivenBack", testClaimStillCommitting)
}

// raisedSync is the synchronous_commit a claim that takes a row must leave
// for its commit, given the session's.
func raisedSync(session string) string {
	if session == "off" || session == "local" {
		return "on"
	}
	return session
}

// claimInTx runs a claim statement inside a transaction that is rolled back,
// with the session's synchronous_commit and any other settings (name,
// value pairs) set first, and reports how many rows the claim returned and
// the synchronous_commit its commit would have used.
func claimInTx(t *testing.T, pool pglease.DB, settings []string, sql string, args ...any) (int, string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	for i := 0; i < len(settings); i += 2 {
		_, err = tx.Exec(ctx, "SELECT set_config($1, $2, true)", settings[i], settings[i+1])
		require.NoError(t, err)
	}
	rows, err := tx.Query(ctx, sql, args...)
	require.NoError(t, err)
	got := 0
	for rows.Next() {
		got++
	}
	require.NoError(t, rows.Err())
	var setting string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&setting))
	return got, setting
}

var commitSettings = []string{"on", "off", "local", "remote_write", "remote_apply"}

// testClaimCommitSetting pins deferSyncCommit and raiseSyncCommit: every
// claim statement that takes at least one row must leave synchronous_commit
// at least at on (the session's when stronger) for its commit, whatever
// else the statement met, whatever plan the server chose, and whatever a
// user put in pglease.synchronous_commit.
func testClaimCommitSetting(t *testing.T) { // the subtests share one key counter and one holder
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	tbl := pgx.Identifier{table}
	other := pgtest.Locker(t, pool, table, "other", pglease.WithTTL(time.Minute))
	n := 0
	fresh := func(prefix string) string { n++; return fmt.Sprintf("%s-%05d", prefix, n) }
	held := func(prefix string) string {
		key := fresh(prefix)
		_, err := other.Claim(ctx, key)
		require.NoError(t, err)
		return key
	}
	claimAll := sqlstmt.Render(sqlstmt.ClaimAll, tbl)

	// A burst where some rows are taken and some are not, in every order
	// of the sort (ORDER BY key): the last row the statement judges is one
	// it does not take.
	t.Run("BurstMixed", func(t *testing.T) {
		for _, session := range commitSettings {
			for _, shape := range []string{"TH", "HT", "THTH", "HTHT", "THHH", "HHHT"} {
				var keys []string
				taken := 0
				for i, c := range shape {
					p := fmt.Sprintf("%c%d", 'a'+i, i)
					if c == 'T' {
						keys = append(keys, fresh(p))
						taken++
					} else {
						keys = append(keys, held(p))
					}
				}
				ttls := make([]float64, len(keys))
				for i := range ttls {
					ttls[i] = 60
				}
				got, setting := claimInTx(t, pool, []string{"synchronous_commit", session}, claimAll, "claimer", ttls, keys, "500ms")
				require.Equal(t, taken, got, "session %s shape %s", session, shape)
				require.Equal(t, raisedSync(session), setting, "session %s, burst %s (T taken, H held): a burst that took %d rows commits with synchronous_commit %s", session, shape, taken, setting)
			}
		}
	})

	// A large burst against a table with many rows and fresh statistics,
	// so the planner may pick another join (hash anti join, a rescanned
	// clock): the burst still takes rows durably, and every row it takes has
	// the one clock reading.
	t.Run("BurstLarge", func(t *testing.T) {
		var keys []string
		taken := 0
		for i := range 400 {
			if i%2 == 0 {
				keys = append(keys, fresh("large"))
				taken++
			} else {
				keys = append(keys, held("large"))
			}
		}
		_, err := pool.Exec(ctx, "ANALYZE "+tbl.Sanitize())
		require.NoError(t, err)
		sort.Strings(keys)
		ttls := make([]float64, len(keys))
		for i := range ttls {
			ttls[i] = 60
		}
		for _, session := range commitSettings {
			for _, mode := range []string{"auto", "force_generic_plan", "force_custom_plan"} {
				got, setting := claimInTx(t, pool, []string{"synchronous_commit", session, "plan_cache_mode", mode}, claimAll, "claimer", ttls, keys, "500ms")
				require.Equal(t, taken, got)
				require.Equal(t, raisedSync(session), setting, "session %s, plan_cache_mode %s", session, mode)
			}
		}
		var plan []string
		rows, err := pool.Query(ctx, "EXPLAIN (VERBOSE, COSTS OFF) "+claimAll, "claimer", ttls, keys, "500ms")
		require.NoError(t, err)
		for rows.Next() {
			var line string
			require.NoError(t, rows.Scan(&line))
			if len(line) > 200 {
				line = line[:200] + "..."
			}
			plan = append(plan, line)
		}
		require.NoError(t, rows.Err())
		t.Logf("plan of a burst of %d:\n%s", len(keys), strings.Join(plan, "\n"))
	})

	// Generic plans, reached by executing the same prepared statement
	// repeatedly with plan_cache_mode forced, for each claim form.
	t.Run("GenericPlan", func(t *testing.T) {
		conn, err := pool.Acquire(ctx)
		require.NoError(t, err)
		defer conn.Release()
		_, err = conn.Exec(ctx, "SET plan_cache_mode = force_generic_plan")
		require.NoError(t, err)
		defer func() { _, _ = conn.Exec(context.Background(), "RESET plan_cache_mode") }()
		claim := sqlstmt.Render(sqlstmt.Claim, tbl)
		unfenced := sqlstmt.Render(sqlstmt.UnfencedClaimFor(true), tbl)
		for i := range 8 {
			for _, session := range commitSettings {
				for _, take := range []bool{true, false} {
					forms := map[string][]any{}
					if take {
						forms[claim] = []any{fresh("g"), "claimer", 60.0}
						forms[claimAll] = []any{"claimer", []float64{60, 60}, []string{fresh("g1"), held("g2")}, "500ms"}
						forms[unfenced] = []any{fresh("u"), "claimer#0123456789abcdef", 60.0, "claimer#", nil}
					} else {
						forms[claim] = []any{held("g"), "claimer", 60.0}
						forms[claimAll] = []any{"claimer", []float64{60}, []string{held("g1")}, "500ms"}
					}
					for sql, args := range forms {
						got, setting := claimInTx(t, conn, []string{"synchronous_commit", session}, sql, args...)
						if take {
							require.Positive(t, got)
							require.Equal(t, raisedSync(session), setting, "run %d, session %s, %.40s", i, session, sql)
						} else {
							require.Zero(t, got)
						}
					}
				}
			}
		}
	})

	// A user (or a role or database default) that sets the custom setting
	// the claim saves the session's value in, to a weaker or bogus value,
	// before the claim: the claim must still raise.
	t.Run("UserSetsTheSavedSetting", func(t *testing.T) {
		claim := sqlstmt.Render(sqlstmt.Claim, tbl)
		for _, bogus := range []string{"off", "local", "bogus", ""} {
			for _, session := range commitSettings {
				got, setting := claimInTx(t, pool, []string{"pglease.synchronous_commit", bogus, "synchronous_commit", session}, claim, fresh("b"), "claimer", 60.0)
				require.Equal(t, 1, got)
				require.Equal(t, raisedSync(session), setting, "pglease.synchronous_commit=%q, session %s", bogus, session)
				got, setting = claimInTx(t, pool, []string{"pglease.synchronous_commit", bogus, "synchronous_commit", session}, claimAll,
					"claimer", []float64{60, 60}, []string{fresh("b1"), held("b2")}, "500ms")
				require.Equal(t, 1, got)
				require.Equal(t, raisedSync(session), setting, "burst: pglease.synchronous_commit=%q, session %s", bogus, session)
			}
		}
		// And at the session level, as a connection parameter (what a role
		// or database default gives a new session).
		p := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
			cfg.MaxConns = 2
			cfg.ConnConfig.RuntimeParams["pglease.synchronous_commit"] = "off"
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		})
		l := pgtest.Locker(t, p, table, "sessionbogus")
		_, err := l.Claim(ctx, fresh("s"))
		require.NoError(t, err, "a claim on a session with pglease.synchronous_commit preset")
		got, setting := claimInTx(t, p, nil, claim, fresh("s"), "claimer", 60.0)
		require.Equal(t, 1, got)
		require.Equal(t, "on", setting)
	})
}

// testClaimsInOneTransaction: a DB that hands the Locker a connection
// inside a transaction of its owner's (a pgx.Tx is refused, but a wrapper
// around one, or a *pgx.Conn in a transaction, is not detected) makes two
// claims one transaction, the first taking its row, the second losing. The
// second claim must not turn the synchronous commit the first raised off
// again: the transaction holds an acknowledged claim.
func testClaimsInOneTransaction(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	tbl := pgx.Identifier{table}
	other := pgtest.Locker(t, pool, table, "other", pglease.WithTTL(time.Minute))
	_, err := other.Claim(ctx, "held")
	require.NoError(t, err)
	claim := sqlstmt.Render(sqlstmt.Claim, tbl)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	var fence int64
	require.NoError(t, tx.QueryRow(ctx, claim, "free", "claimer", 60.0).Scan(&fence, nil, nil, nil, nil, nil))
	rows, err := tx.Query(ctx, claim, "held", "claimer", 60.0)
	require.NoError(t, err)
	rows.Close()
	require.NoError(t, rows.Err())
	var setting string
	require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&setting))
	require.Equal(t, "on", setting, "a transaction holding a claim that took a row (fence %d) commits with synchronous_commit %s", fence, setting)
}

// testBurstClaimsSurviveACrash: bursts whose statements take some
// rows and lose others (keys held by another Locker), on sessions with
// synchronous_commit off, then a crash with the WAL writer asleep: every
// claim acknowledged from a burst is live after the restart with its fence,
// and no fence issued before the crash is issued again.
func testBurstClaimsSurviveACrash(t *testing.T) {
	t.Parallel()
	srv := pgtest.CrashableServer(t)
	ctx := pgtest.Ctx(t)
	table := pgtest.DurableTable(t, srv)
	pool := pgtest.PoolWith(t, srv.DSN(), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	})
	holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(time.Minute))
	claimer := pgtest.Locker(t, pool, table, "claimer", pglease.WithTTL(time.Minute))

	fences := map[string]int64{}
	var maxFence int64
	for b := range 40 {
		// Held keys sort last in every burst: the statement's final row is
		// one it does not take.
		var keys []string
		for k := range 5 {
			keys = append(keys, fmt.Sprintf("b%02d-a%d", b, k))
		}
		for k := range 3 {
			key := fmt.Sprintf("b%02d-z%d", b, k)
			lease, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			fences[key] = lease.Fence()
			maxFence = max(maxFence, lease.Fence())
			keys = append(keys, key)
		}
		leases, errs := pglease.ClaimBurst(ctx, claimer, keys)
		for i, key := range keys {
			if key[4] == 'z' {
				require.ErrorIs(t, errs[i], pglease.ErrHeld, key)
				continue
			}
			require.NoError(t, errs[i], key)
			fences[key] = leases[i].Fence()
			maxFence = max(maxFence, leases[i].Fence())
		}
	}
	pgtest.CrashAndRestart(t, srv)
	pool.Close()
	_ = claimer.Close(ctx)
	_ = holder.Close(ctx)

	after := pgtest.PoolAt(t, srv.DSN(), nil)
	var gone []string
	for key, fence := range fences {
		row, ok := pgtest.ReadRow(t, after, table, key)
		if !ok || row.Fence != fence || !row.Live {
			gone = append(gone, key)
		}
	}
	require.Empty(t, gone, "of %d claims acknowledged before the crash, these are gone or changed after it", len(fences))
	other := pgtest.Locker(t, after, table, "other", pglease.WithTTL(time.Minute))
	lease, err := other.Claim(ctx, "fresh")
	require.NoError(t, err)
	require.Greater(t, lease.Fence(), maxFence, "a fence after the crash is above every fence issued before it")
}

// Presets of pglease.synchronous_commit and synchronous_commit on the
// session (as a role's ALTER ROLE ... SET gives them): a claim that takes a
// row must leave its transaction committing at least at on.
func testClaimCommitSettingUnderPresets(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	tbl := pgx.Identifier{table}
	claim := sqlstmt.Render(sqlstmt.Claim, tbl)
	other := pgtest.Locker(t, pool, table, "other")
	n := 0
	for _, saved := range []string{"", "off", "on", "local", "remote_write", "remote_apply", "garbage"} {
		for _, sc := range []string{"off", "local", "on", "remote_write", "remote_apply"} {
			cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
			require.NoError(t, err)
			cfg.RuntimeParams["synchronous_commit"] = sc
			if saved != "" {
				cfg.RuntimeParams["pglease.synchronous_commit"] = saved
			}
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			for _, took := range []bool{true, false} {
				n++
				key := fmt.Sprintf("k%d", n)
				tx, err := conn.Begin(ctx)
				require.NoError(t, err)
				if !took {
					// A first claim of the transaction that takes nothing.
					_, err = other.Claim(ctx, key+"-held")
					require.NoError(t, err)
					rows, err := tx.Query(ctx, claim, key+"-held", "claimer", 60.0)
					require.NoError(t, err)
					rows.Close()
					require.NoError(t, rows.Err())
				}
				var fence int64
				require.NoError(t, tx.QueryRow(ctx, claim, key, "claimer", 60.0).Scan(&fence, nil, nil, nil, nil, nil))
				var got string
				require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got))
				require.NoError(t, tx.Commit(ctx))
				want := map[string]bool{"on": true, "remote_write": true, "remote_apply": true}
				require.True(t, want[got], "preset pglease.synchronous_commit=%q synchronous_commit=%q (earlier empty claim %v): claim commits at %q", saved, sc, !took, got)
				if sc == "remote_apply" || sc == "remote_write" {
					require.Equal(t, sc, got, "the operator's stronger setting was weakened")
				}
			}
			require.NoError(t, conn.Close(ctx))
		}
	}
}

// lockerOn is a DB a Locker may be given, with the options it is given.
type lockerOn struct {
	db   pglease.DB
	opts []pglease.Option
}

// unreplicatedDBs are the DBs a Locker may be given, each on the server of
// pool: the pool itself (and with WithKeptConnection), one *pgx.Conn, and
// pglease.SQL with pgx's stdlib and with lib/pq.
func unreplicatedDBs(ctx context.Context, t *testing.T, pool *pgxpool.Pool) map[string]lockerOn {
	t.Helper()
	conn, err := pgx.Connect(ctx, pool.Config().ConnString())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return map[string]lockerOn{
		"pool":      {db: pool},
		"pool-kept": {db: pool, opts: []pglease.Option{pglease.WithKeptConnection()}},
		"conn":      {db: conn},
		"sql-pgx":   {db: pglease.SQL(pgtest.OpenSQL(t, pool, "pgx"))},
		"sql-pq":    {db: pglease.SQL(pgtest.OpenSQL(t, pool, "pq"))},
	}
}

// locker is a quiet Locker on o's DB and table, with o's options and opts.
func (o lockerOn) locker(t *testing.T, table, holder string, opts ...pglease.Option) *pglease.Locker {
	t.Helper()
	return pgtest.Locker(t, o.db, table, holder, append(append([]pglease.Option(nil), o.opts...), opts...)...)
}

func testClaimUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, _, pool, table := pgtest.UnreplicatedSetup(t)
	for name, on := range unreplicatedDBs(ctx, t, pool) {
		for _, via := range []string{"Claim", "Lock"} {
			t.Run(name+"/"+via, func(t *testing.T) {
				holder, key := name+"-"+via, "job-"+name+"-"+via
				l := on.locker(t, table, holder, pglease.WithTTL(30*time.Second), pglease.WithTimeout(300*time.Millisecond))
				start := time.Now()
				var err error
				if via == "Claim" {
					cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
					_, err = l.Claim(cctx, key)
					cancel()
				} else {
					_, err = l.Lock(ctx, key)
				}
				took := time.Since(start)
				require.Error(t, err, "a claim whose commit was not replicated was handed out")
				require.ErrorIs(t, err, context.DeadlineExceeded)
				_, held := l.Held(key)
				assert.False(t, held)
				assert.Less(t, took, 300*time.Millisecond+2*time.Second, "Claim returns within two seconds of its context's end")
				requireNoLiveRowOf(t, pool, table, holder, 5*time.Second, key)
			})
		}
	}
}

func testLosingClaimUnreplicated(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	held, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
	require.NoError(t, err)
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	for name, on := range unreplicatedDBs(ctx, t, pool) {
		t.Run(name, func(t *testing.T) {
			cctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			defer cancel()
			_, err := on.locker(t, table, "b-"+name).Claim(cctx, "job")
			require.ErrorIs(t, err, pglease.ErrHeld)
			require.NoError(t, cctx.Err(), "the losing claim waited for the standby")
		})
	}
	require.NoError(t, held.Err())
}

func testClaimStillCommitting(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	prior, err := pgtest.Locker(t, pool, table, "prior").Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, prior.Unlock(ctx)) // the claim below updates a row
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	wire := pgtest.NewWire(t, pool) // a DB, not a pool: the Locker cannot cancel
	t.Cleanup(func() { pgtest.StandbyBack(context.Background(), t, srv.DSN()) })
	claim := wire.Arm(pgtest.Kind("claim"), pgtest.GoOn)
	l := pgtest.Locker(t, wire, table, "holder", pglease.WithTTL(time.Minute))

	returned := make(chan error, 1)
	go func() {
		cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		_, err := l.Claim(cctx, "job")
		returned <- err
	}()
	<-claim.Hit
	// The standby comes back once the Locker's read of the row waits on
	// the claim's transaction, or once the claim has returned without it:
	// by a reload alone, the rest readied here, since the read waits on
	// the row lock only half of the give-back's bound (375 ms).
	standbyBack := pgtest.StandbyReady(ctx, t, srv.DSN())
	var claimErr error
	waiting := false
	for !waiting {
		select {
		case claimErr = <-returned:
			waiting = true
			returned <- claimErr
		case <-time.After(5 * time.Millisecond):
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND query LIKE 'SELECT holder, fence, expires_at%'`).Scan(&n))
			waiting = n > 0
		}
	}
	standbyBack()
	claimErr = <-returned
	require.ErrorIs(t, claimErr, context.DeadlineExceeded, "the claim's commit waited for the standby past its context")
	<-claim.Ran
	_, held := l.Held("job")
	assert.False(t, held)
	requireNoLiveRowOf(t, pool, table, "holder", 5*time.Second, "job")
}

type claimFailedKey struct{}

// claimEvents are the events of the claims of key: EventContended and
// EventClaimFailed.
func claimEvents(ev *pgtest.Events, key string) []pglease.Event {
	var out []pglease.Event
	for _, e := range ev.All() {
		if e.Key == key && (e.Kind == pglease.EventContended || e.Kind == pglease.EventClaimFailed) {
			out = append(out, e)
		}
	}
	return out
}

// requireOneFailure checks that err is the one failure event of key's
// claims: its kind, the very error returned, the key named once and
// prefixed once, and the claim's context.
func requireOneFailure(t *testing.T, ev *pgtest.Events, key string, kind pglease.EventKind, err error) pglease.Event {
	t.Helper()
	require.Error(t, err)
	es := claimEvents(ev, key)
	require.Len(t, es, 1, "one event for the failed claim of %q: %v", key, es)
	e := es[0]
	require.Equal(t, kind, e.Kind, "%v", e.Err)
	require.Equal(t, err.Error(), e.Err.Error())
	require.Equal(t, 1, strings.Count(err.Error(), "pglease: "), "prefixed once: %v", err)
	require.Equal(t, 1, strings.Count(err.Error(), fmt.Sprintf("claim %q", key)), "key named once: %v", err)
	require.NotNil(t, e.Context, "the claim's context")
	require.Equal(t, "v", e.Context.Value(claimFailedKey{}), "the caller's values readable")
	return e
}

func testClaimFailuresOnAClosedLocker(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	ctx = context.WithValue(ctx, claimFailedKey{}, "v")
	ev := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(ev.Hook))
	j := mustJob(t, l, pglease.WithTTL(90*time.Second))
	p := mustJob(t, l, pglease.WithPeriod(time.Second))
	require.NoError(t, l.Close(ctx))
	//nolint:staticcheck // a nil Context on purpose
	require.Contains(t, panicMessage(func() { _, _ = l.Claim(nil, "closed-nil") }), "nil Context", "a nil Context on a closed Locker")
	//nolint:staticcheck // a nil Context on purpose
	require.Contains(t, panicMessage(func() { _, _ = p.Lock(nil, "closed-nil") }), "nil Context")
	require.Empty(t, claimEvents(ev, "closed-nil"))
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	for name, claim := range map[string]func(string) error{
		"Claim":              func(k string) error { _, err := l.Claim(ctx, k); return err },
		"Claim (cancelled)":  func(k string) error { _, err := l.Claim(cctx, k); return err },
		"Lock":               func(k string) error { _, err := l.Lock(ctx, k); return err },
		"Job.Claim":          func(k string) error { _, err := j.Claim(ctx, k); return err },
		"Job.Lock":           func(k string) error { _, err := j.Lock(ctx, k); return err },
		"Period.Claim":       func(k string) error { _, err := p.Claim(ctx, k); return err },
		"Period.Lock":        func(k string) error { _, err := p.Lock(ctx, k); return err },
		"Period.Lock (canc)": func(k string) error { _, err := p.Lock(cctx, k); return err },
	} {
		key := "closed-" + strings.NewReplacer(" ", "", "(", "", ")", "", ".", "").Replace(name)
		var err error
		require.NotPanics(t, func() { err = claim(key) }, name)
		require.ErrorIs(t, err, pglease.ErrClosed, name)
		require.Equal(t, 1, strings.Count(err.Error(), "locker closed"), "%s: %v", name, err)
		requireOneFailure(t, ev, key, pglease.EventClaimFailed, err)
		t.Logf("%s: %v", name, err)
	}
}
