package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestUnlock pins that an Unlock waiting on a locked row costs no other
// lease of its Locker.
func TestUnlock(t *testing.T) {
	t.Parallel()
	t.Run("AgainstLocksAndTimeouts", testUnlockAgainstLocksAndTimeouts)
	t.Run("UnderSerializable", testUnlockUnderSerializable)
	t.Run("GetsThroughABusyNotificationQueue", testUnlockBehindABusyNotificationQueue)
	t.Run("BusyNotificationQueueHoldsTheHeartbeatLittle", testHeartbeatBehindUnlocksOnABusyNotificationQueue)
	// Guarantee: heartbeat.go promises "a release stuck on an unreachable
	// database delays no loss, and a row locked past it costs that lease
	// alone". Guard makes a lease row lockable by the application for as long
	// as it likes. An Unlock of that lease (from any goroutine, or from the
	// job itself before its COMMIT) then waits on the row lock inside the
	// release gate, and no heartbeat round may run while a release is in the
	// gate: every other lease of the Locker starves and is lost.
	t.Run("OnAGuardedRowCostsNoOtherLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second),
			pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithTimeout(4*time.Second))

		guarded, err := l.Claim(ctx, "guarded")
		require.NoError(t, err)
		other, err := l.Claim(ctx, "other")
		require.NoError(t, err)

		tx := guardedTx(t, pool, guarded)

		unlocked := make(chan error, 1)
		go func() { unlocked <- guarded.Unlock(ctx) }()

		// Three TTLs while the release waits: the heartbeat must keep "other".
		select {
		case <-other.Done():
			t.Errorf("lease %q was lost while an Unlock of %q waited on its guarded row: %v", other.Key(), guarded.Key(), other.Err())
		case <-time.After(3 * time.Second):
		}
		require.NoError(t, tx.Commit(ctx))
		// The release skipped the locked row and sent itself again until the
		// guarded transaction ended, within its timeout.
		// (its row lapsed meanwhile: the heartbeat could not extend a locked row)
		uerr := <-unlocked
		t.Logf("unlock of the guarded lease: %v", uerr)
		require.True(t, uerr == nil || errors.Is(uerr, pglease.ErrLost), "the release of the guarded lease: %v", uerr)
		require.NoError(t, other.Err())
	})

	// Guarantee: one locked row costs nothing it need not, also through the
	// round gate. A release (Unlock) is a plain UPDATE that waits on the
	// row lock, and while it is in flight the gate keeps every heartbeat
	// round out. With WithTimeout at its default (5s) and a TTL of 2s, an
	// Unlock of one locked row makes every other lease of the Locker lost,
	// with the database healthy and their rows free.
	t.Run("OnALockedRowCostsNoOtherLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second), pglease.WithHook(events.Hook))
		locked, err := l.Claim(ctx, "locked")
		require.NoError(t, err)
		other, err := l.Claim(ctx, "other")
		require.NoError(t, err)
		end := pgtest.LockRow(t, pool, table, "locked")
		defer end(false)

		start := time.Now()
		uerr := locked.Unlock(ctx)
		took := time.Since(start)
		require.NoError(t, other.Err(), "lease %q, whose row nobody locked, after Unlock of %q took %v (%v)", other.Key(), locked.Key(), took, uerr)
	})

	// A claim of another replica that met the row as it changed hands
	// locks it for one commit; an Unlock meeting that lock waits it out
	// and releases in one statement, rather than being sent again and
	// again while replicas keep claiming.
	t.Run("WaitsOutARowLockOfOneCommit", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, stmts := pgtest.SetupCounted(t)
		l := pgtest.Locker(t, pool, table, "short")
		pglease.SetCoalesceAll(l, false) // the statement of an Unlock alone, whatever the run's switch
		wait, err := time.ParseDuration(driver.ReleaseLockWait)
		require.NoError(t, err)
		// The lock is of one commit, 5 ms after the Unlock starts; on a
		// stalled machine that commit can itself come later than the
		// release's lock wait, and the case is then another: tried again
		// on a fresh key, a few times.
		for attempt := 0; ; attempt++ {
			key := fmt.Sprintf("short-%d", attempt)
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			tx := pgtest.LockRows(t, pool, table, "key = $1", key)
			committed := make(chan time.Time, 1)
			go func() {
				time.Sleep(5 * time.Millisecond)
				_ = tx.Commit(context.Background())
				committed <- time.Now()
			}()
			stmts.Reset()
			start := time.Now()
			require.NoError(t, lease.Unlock(ctx))
			sent := stmts.Count("release")
			late := (<-committed).Sub(start)
			if sent > 1 && late > wait && attempt < 4 {
				t.Logf("the lock's commit came %v after the Unlock started, past the release's lock wait (%v): again", late, wait)
				continue
			}
			assert.Equal(t, 1, sent, "an Unlock behind a row lock of one commit was sent again (the commit came %v after it started)", late)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			assert.False(t, row.Live, "the row is still live after its Unlock")
			return
		}
	})

	// A row locked for long (an operator's or a guarded job's transaction)
	// is skipped after a short wait, not waited on: the Locker's heartbeat
	// keeps its period meanwhile, and the Unlock releases the row once the
	// transaction ends.
	t.Run("SkipsARowLockedLong", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, stmts := pgtest.SetupCounted(t)
		const interval = 100 * time.Millisecond
		rounds := make(chan time.Time, 64)
		l := pgtest.Locker(t, pool, table, "long", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(interval),
			pglease.WithHook(func(ev pglease.Event) {
				if ev.Kind == pglease.EventExtended {
					select {
					case rounds <- time.Now():
					default:
					}
				}
			}))
		locked, err := l.Claim(ctx, "locked")
		require.NoError(t, err)
		_, err = l.Claim(ctx, "other")
		require.NoError(t, err)
		tx := pgtest.LockRows(t, pool, table, "key = $1", "locked")
		const held = 700 * time.Millisecond
		commitAfter(t, tx, held)
		start := time.Now()
		unlocked := make(chan error, 1)
		go func() { unlocked <- locked.Unlock(ctx) }()

		// Rounds go on while the Unlock waits for the transaction.
		for len(rounds) > 0 {
			<-rounds
		}
		extended := 0
		for time.Since(start) < held-2*interval {
			select {
			case <-rounds:
				extended++
			case <-time.After(held):
			}
		}
		assert.GreaterOrEqual(t, extended, 2, "the heartbeat stalled while an Unlock met a row locked by a long transaction")
		select {
		case err := <-unlocked:
			require.NoError(t, err)
		case <-time.After(5 * time.Second):
			t.Fatal("the Unlock did not return after the transaction ended")
		}
		assert.GreaterOrEqual(t, time.Since(start), held, "the Unlock returned before the transaction that locked its row ended")
		assert.Greater(t, stmts.Count("release"), 1, "the row was not skipped and sent again")
		row, ok := pgtest.ReadRow(t, pool, table, "locked")
		require.True(t, ok)
		assert.False(t, row.Live, "the row is still live after its Unlock")
	})

	// Guarantee: a late release of a previous mandate leaves the lease that
	// reclaimed the key untouched.
	t.Run("LateReleaseSparesTheReclaimedLease", func(t *testing.T) {
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
	})

	// Guarantee: Unlock expires the row in place and never deletes it.
	t.Run("ExpiresTheRowInPlace", func(t *testing.T) {
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
		assert.Equal(t, a.Holder(), row.Holder)
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
	})

	// Guarantee: with a min hold, Unlock keeps the lease until its acquisition
	// plus the min hold.
	t.Run("KeepsTheMinHold", func(t *testing.T) {
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
	})

	// Guarantee: Unlock releases even when its context is already cancelled.
	t.Run("ReleasesUnderACancelledContext", func(t *testing.T) {
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
	})
}

// commitAfter commits tx after d, on a goroutine of its own that the test
// waits for before its cleanup rolls tx back.
func commitAfter(t *testing.T, tx pgx.Tx, d time.Duration) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		time.Sleep(d)
		_ = tx.Commit(context.Background())
	}()
	t.Cleanup(func() { <-done })
}

// lockRowFor holds key's row in table locked in mode (FOR UPDATE, FOR
// SHARE, ...) from an open transaction that commits after d, on a goroutine
// the test waits for.
func lockRowFor(t *testing.T, pool *pgxpool.Pool, table, key, mode string, d time.Duration) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = $1 %s`, pgx.Identifier{table}.Sanitize(), mode), key)
	require.NoError(t, err)
	commitAfter(t, tx, d)
}

// roundCounter counts heartbeat rounds (EventExtended) as they happen.
type roundCounter struct {
	mu    sync.Mutex
	times []time.Time
}

func (r *roundCounter) hook(ev pglease.Event) {
	if ev.Kind == pglease.EventExtended {
		r.mu.Lock()
		r.times = append(r.times, time.Now())
		r.mu.Unlock()
	}
}

// between is how many rounds ended in [from, to).
func (r *roundCounter) between(from, to time.Time) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	n := 0
	for _, at := range r.times {
		if !at.Before(from) && at.Before(to) {
			n++
		}
	}
	return n
}

// testUnlockAgainstLocksAndTimeouts: the release of one lease
// (sqlstmt.ReleaseOne, with its 20ms lock wait and the Locker's resend on
// 55P03) against every kind of row and table lock, a plan invalidated in
// flight, generic plans, a re-entrant claim racing it, and the session's
// own lock and statement timeouts.
func testUnlockAgainstLocksAndTimeouts(t *testing.T) { // timing-sensitive subtests, one at a time
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)

	// A row lock of every mode, held for long by an open transaction: the
	// Unlock releases once the transaction ends (FOR KEY SHARE does not
	// even conflict), the heartbeat keeps its period meanwhile, the min
	// hold is kept, and the outcome is released. The modes wait out their
	// locks side by side, each with its own Locker, on a pool of its own
	// (the other modes' transactions and waiting Unlocks take none of its
	// connections), and its own key.
	t.Run("RowLockModes", func(t *testing.T) {
		const interval = 100 * time.Millisecond
		const held = 1200 * time.Millisecond
		// The min hold outlasts the claim, the lock and the Unlock's wait
		// for it, by 1.3 s for a loaded machine's four modes at once.
		const minHold = 2500 * time.Millisecond
		var wg sync.WaitGroup
		for _, mode := range []string{"FOR KEY SHARE", "FOR SHARE", "FOR NO KEY UPDATE", "FOR UPDATE"} {
			rounds := &roundCounter{}
			l := pgtest.Locker(t, pgtest.Pool(t, nil), table, "modes-"+mode, pglease.WithTTL(3*time.Second),
				pglease.WithHeartbeatInterval(interval), pglease.WithMinHold(minHold), pglease.WithHook(rounds.hook))
			key := "mode " + mode
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			keep, err := l.Claim(ctx, key+" kept")
			require.NoError(t, err)
			wg.Go(func() {
				lockRowFor(t, pool, table, key, mode, held)
				start := time.Now()
				err = lease.Unlock(ctx)
				took := time.Since(start)
				if !assert.NoError(t, err, "%s: the Unlock's outcome", mode) { //nolint:testifylint // on a goroutine of its own: require would stop it, not the test
					return
				}
				row, ok := pgtest.ReadRow(t, pool, table, key)
				if !assert.True(t, ok, mode) {
					return
				}
				assert.Equal(t, lease.Fence(), row.Fence, mode)
				assert.WithinDuration(t, row.AcquiredAt.Add(minHold), row.ExpiresAt, 5*time.Millisecond,
					"%s: a released row with a min hold expires at acquired_at + min hold", mode)
				if mode == "FOR KEY SHARE" {
					assert.Less(t, took, held/2, "FOR KEY SHARE does not conflict with the release's update, yet the Unlock waited")
				} else {
					assert.GreaterOrEqual(t, took, held-50*time.Millisecond, "%s: the Unlock returned before the transaction ended", mode)
					assert.GreaterOrEqual(t, rounds.between(start, start.Add(held-interval)), 2,
						"%s: the heartbeat stalled while an Unlock met a long row lock", mode)
				}
				assert.NoError(t, keep.Err(), mode)
				assert.NoError(t, keep.Unlock(ctx), mode)
			})
		}
		wg.Wait()
	})

	// A lock on the whole table by an operator (LOCK TABLE, in a mode that
	// conflicts with the update): the 55P03 read as "row locked" comes
	// only from the row; a table lock is waited on, and the Unlock's
	// outcome after it is still the truth.
	t.Run("TableLock", func(t *testing.T) {
		for _, mode := range []string{"SHARE", "ACCESS EXCLUSIVE", "EXCLUSIVE"} {
			l := pgtest.Locker(t, pool, table, "tablelock", pglease.WithTTL(5*time.Second))
			key := "table " + mode
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, fmt.Sprintf("LOCK TABLE %s IN %s MODE", pgx.Identifier{table}.Sanitize(), mode))
			require.NoError(t, err)
			commitAfter(t, tx, 300*time.Millisecond)
			require.NoError(t, lease.Unlock(ctx), "%s", mode)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.False(t, row.Live, "%s: released, yet the row is live", mode)
		}
	})

	// An operator's ALTER TABLE in an open transaction (rolled back after
	// 300ms): the release waits for the table, then its statement, whose
	// cached plan the ALTER invalidated, is planned again and releases.
	t.Run("AlterTable", func(t *testing.T) {
		l := pgtest.Locker(t, pool, table, "altertable", pglease.WithTTL(5*time.Second))
		// A first release so the statement is prepared and cached.
		warm, err := l.Claim(ctx, "alter warm")
		require.NoError(t, err)
		require.NoError(t, warm.Unlock(ctx))
		lease, err := l.Claim(ctx, "alter")
		require.NoError(t, err)
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, fmt.Sprintf("ALTER TABLE %s ADD COLUMN note text", pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)
		done := make(chan struct{})
		go func() {
			defer close(done)
			time.Sleep(300 * time.Millisecond)
			_ = tx.Rollback(context.Background())
		}()
		t.Cleanup(func() { <-done })
		require.NoError(t, lease.Unlock(ctx))
		row, ok := pgtest.ReadRow(t, pool, table, "alter")
		require.True(t, ok)
		require.False(t, row.Live)
	})

	// Generic plans on the Locker's sessions: the release's guard and lock
	// wait behave the same.
	t.Run("GenericPlan", func(t *testing.T) {
		p := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
			cfg.MaxConns = 2
			cfg.ConnConfig.RuntimeParams["plan_cache_mode"] = "force_generic_plan"
		})
		l := pgtest.Locker(t, p, table, "generic", pglease.WithTTL(5*time.Second))
		other := pgtest.Locker(t, p, table, "generic", pglease.WithTTL(5*time.Second), pglease.StoredHolder(l.Holder()))
		for i := range 8 {
			key := fmt.Sprintf("generic-%d", i)
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			if i%2 == 1 {
				// Superseded first: the late release must find nothing.
				fresh, err := other.Claim(ctx, key)
				require.NoError(t, err)
				before, _ := pgtest.ReadRow(t, pool, table, key)
				require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost, key)
				after, _ := pgtest.ReadRow(t, pool, table, key)
				require.Equal(t, before, after, "%s: the late release touched the new mandate's row", key)
				require.NoError(t, fresh.Unlock(ctx))
				continue
			}
			lockRowFor(t, pool, table, key, "FOR UPDATE", 100*time.Millisecond)
			require.NoError(t, lease.Unlock(ctx), key)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.False(t, row.Live, key)
		}
	})

	// A lease superseded by a re-entrant claim of the same holder (another
	// Locker storing its holder, as a claim whose reply was lost) while its Unlock
	// is on its way: the late release of the old mandate never touches the
	// new mandate's row, and its outcome is released (it came first) or
	// ErrLost.
	t.Run("ReentrantRace", func(t *testing.T) { raceReentrantClaimWithUnlock(ctx, t, pool, table) })

	// A role or session statement_timeout shorter than the release's lock
	// wait: a row locked for a moment (a claim in flight, a short
	// transaction) must still be released, as the skip-locked release
	// did, not abandoned on "canceling statement due to statement
	// timeout".
	t.Run("StatementTimeoutBelowLockWait", func(t *testing.T) {
		p := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
			cfg.MaxConns = 4
			cfg.ConnConfig.RuntimeParams["statement_timeout"] = "10ms"
		})
		l := pgtest.Locker(t, p, table, "stmttimeout", pglease.WithTTL(5*time.Second))
		// The claim runs under the same 10ms: on a loaded machine it may
		// itself be timed out, which is the session's setting at work, not
		// the release under test. Claimed again, a few times at most.
		var lease *pglease.Lease
		var err error
		for attempt := 1; ; attempt++ {
			if lease, err = l.Claim(ctx, "stmt timeout"); err == nil {
				break
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr) && pgErr.Code == "57014", "a claim failed on something other than its statement_timeout: %v", err)
			require.Less(t, attempt, 20, "every claim timed out: %v", err)
		}
		lockRowFor(t, pool, table, "stmt timeout", "FOR UPDATE", 200*time.Millisecond)
		err = lease.Unlock(ctx)
		require.NoError(t, err, "Unlock of a row locked for 200ms on a session with statement_timeout 10ms")
		row, ok := pgtest.ReadRow(t, pool, table, "stmt timeout")
		require.True(t, ok)
		require.False(t, row.Live, "the Unlock gave up and the row stays held until its TTL")
	})

	// A role or session lock_timeout shorter or longer than the release's
	// own: the statement's wins, for the statement only.
	t.Run("SessionLockTimeout", func(t *testing.T) {
		for _, lt := range []string{"1ms", "10s"} {
			p := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
				cfg.MaxConns = 4
				cfg.ConnConfig.RuntimeParams["lock_timeout"] = lt
			})
			l := pgtest.Locker(t, p, table, "locktimeout"+lt, pglease.WithTTL(5*time.Second))
			key := "lock timeout " + lt
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			lockRowFor(t, pool, table, key, "FOR UPDATE", 300*time.Millisecond)
			start := time.Now()
			require.NoError(t, lease.Unlock(ctx), lt)
			assert.GreaterOrEqual(t, time.Since(start), 250*time.Millisecond, lt)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.False(t, row.Live, lt)
			var after string
			require.NoError(t, p.QueryRow(ctx, "SHOW lock_timeout").Scan(&after))
			require.Equal(t, lt, after, "the release's lock_timeout leaked into the session")
		}
	})

	// Claims of other replicas hammering a key as it changes hands, while
	// its holder releases and re-claims it: no two Lockers ever trust it at
	// once, and every Unlock is released or ErrLost.
	t.Run("ChurnNoOverlap", func(t *testing.T) {
		const replicas = 4
		lockers := make([]*pglease.Locker, replicas)
		for i := range lockers {
			lockers[i] = pgtest.Locker(t, pool, table, fmt.Sprintf("churn-%d", i), pglease.WithTTL(2*time.Second))
		}
		var mu sync.Mutex
		holders := 0
		maxHolders := 0
		var bad []error
		deadline := time.Now().Add(3 * time.Second)
		var wg sync.WaitGroup
		for _, l := range lockers {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for time.Now().Before(deadline) {
					lease, err := l.Claim(ctx, "churn")
					if errors.Is(err, pglease.ErrHeld) {
						continue
					}
					if err != nil {
						mu.Lock()
						bad = append(bad, err)
						mu.Unlock()
						return
					}
					mu.Lock()
					holders++
					maxHolders = max(maxHolders, holders)
					mu.Unlock()
					time.Sleep(time.Millisecond)
					mu.Lock()
					holders--
					mu.Unlock()
					if err := lease.Unlock(ctx); err != nil {
						mu.Lock()
						bad = append(bad, err)
						mu.Unlock()
					}
				}
			}()
		}
		wg.Wait()
		require.Empty(t, bad)
		require.Equal(t, 1, maxHolders, "two Lockers held the key at once")
	})
}

// testUnlockUnderSerializable: with default_transaction_isolation =
// serializable, a release that waited on a row lock and finds the row
// updated by the transaction it waited for fails with 40001 rather than
// rechecking the row (no EvalPlanQual above READ COMMITTED): its outcome
// must still be the truth, released or ErrLost, and a late release of an
// old mandate must never touch the new one's row.
func testUnlockUnderSerializable(t *testing.T) { // the subtests share one database
	t.Parallel()
	ctx, pool, table := serializableSetup(t)

	// An operator's transaction updates the lease's row in place (a
	// no-op update, as a migration or a repair would) and holds it for a
	// while: the Unlock behind it is still released.
	t.Run("RowUpdatedByTheLockHolder", func(t *testing.T) {
		l := pgtest.Locker(t, pool, table, "ser", pglease.WithTTL(5*time.Second))
		for i := range 5 {
			key := fmt.Sprintf("updated-%d", i)
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, fmt.Sprintf("UPDATE %s SET expires_at = expires_at WHERE key = $1", pgx.Identifier{table}.Sanitize()), key)
			require.NoError(t, err)
			commitAfter(t, tx, time.Duration(10+i*30)*time.Millisecond)
			require.NoError(t, lease.Unlock(ctx), key)
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.False(t, row.Live, key)
		}
	})

	// A re-entrant claim of the same holder (another Locker storing it)
	// racing the old mandate's Unlock, serializable.
	t.Run("ReentrantRace", func(t *testing.T) { raceReentrantClaimWithUnlock(ctx, t, pool, table) })
}

// testUnlockBehindABusyNotificationQueue: a release's commit takes the
// server's NOTIFY lock (its pg_notify), which another session's notifying
// commit holds through its WAL flush (an application on the same server that
// notifies from its write transactions, as job queues do, on a disk whose
// flush takes a few tens of milliseconds, simulated with commit_delay). The
// release's lock_timeout is still in force at its commit, so the 55P03 it
// may fail with there is not a row lock: the Unlock must still end
// released (sent again without the notification).
func testUnlockBehindABusyNotificationQueue(t *testing.T) { // the cases load one server with notifiers in turn
	t.Parallel()
	srv := pgtest.CrashableServer(t) // fsync on: commit_delay only delays a real flush
	ctx := pgtest.Ctx(t)
	table := pgtest.DurableTable(t, srv)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	_, err := pool.Exec(ctx, "CREATE TABLE busy (n int)")
	require.NoError(t, err)

	for _, c := range []struct {
		name      string
		notifiers int
		flush     time.Duration
	}{
		{"OneAt15ms", 1, 15 * time.Millisecond},
		{"OneAt30ms", 1, 30 * time.Millisecond},
		{"TwoAt15ms", 2, 15 * time.Millisecond},
		{"OneAt50ms", 1, 50 * time.Millisecond},
		{"TwoAt30ms", 2, 30 * time.Millisecond},
		{"ThreeAt50ms", 3, 50 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			notifyLoad(t, srv.DSN(), c.notifiers, c.flush)
			// What the release's commit meets: a transaction that notifies,
			// with lock_timeout 20ms in force at its commit.
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			_, err = tx.Exec(ctx, "SELECT set_config('lock_timeout', '20ms', true), pg_notify('probe', 'x')")
			require.NoError(t, err)
			t.Logf("a notifying commit with lock_timeout 20ms: %v", tx.Commit(ctx))
			// The same in one statement of its own: its row comes back, then
			// its commit fails.
			rows, err := pool.Query(ctx, "SELECT set_config('lock_timeout', '20ms', true), pg_notify('probe', 'x')")
			require.NoError(t, err)
			n := 0
			for rows.Next() {
				n++
			}
			t.Logf("one statement: %d rows back, then %v", n, rows.Err())

			counter := &pgtest.Statements{}
			lpool := pgtest.PoolAt(t, srv.DSN(), counter)
			l := pgtest.Locker(t, lpool, table, "notified-"+c.name, pglease.WithTTL(2*time.Second))
			for i := range 5 {
				key := fmt.Sprintf("%s-%d", c.name, i)
				lease, err := l.Claim(ctx, key)
				require.NoError(t, err)
				counter.Reset()
				start := time.Now()
				err = lease.Unlock(ctx)
				took := time.Since(start)
				require.NoError(t, err, "%s: Unlock of a lease held live, its row locked by nobody, after %v and %d release statements", key, took, counter.Count("release"))
				row, ok := pgtest.ReadRow(t, pool, table, key)
				require.True(t, ok)
				require.False(t, row.Live, key)
				t.Logf("%s: released in %v, %d release statements", key, took, counter.Count("release"))
			}
		})
	}
}

// notifyLoad runs notifiers sessions until the test ends, each committing
// a write and a notification over and over, each commit holding the NOTIFY
// lock through a flush that takes flush.
func notifyLoad(t *testing.T, dsn string, notifiers int, flush time.Duration) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	stop := make(chan struct{})
	done := make(chan struct{}, notifiers)
	for range notifiers {
		conn, err := pgx.Connect(ctx, dsn)
		require.NoError(t, err)
		_, err = conn.Exec(ctx, fmt.Sprintf("SET commit_delay = %d", flush.Microseconds()))
		require.NoError(t, err)
		_, err = conn.Exec(ctx, "SET commit_siblings = 0")
		require.NoError(t, err)
		go func() {
			defer func() { done <- struct{}{} }()
			defer conn.Close(context.Background())
			for {
				select {
				case <-stop:
					return
				default:
				}
				if _, err := conn.Exec(context.Background(), "WITH w AS (INSERT INTO busy VALUES (1)) SELECT pg_notify('busy', 'x')"); err != nil {
					return
				}
			}
		}()
	}
	t.Cleanup(func() {
		close(stop)
		for range notifiers {
			<-done
		}
	})
}

// testHeartbeatBehindUnlocksOnABusyNotificationQueue: releases in flight
// keep the heartbeat round out (roundGate); a release whose commit waits for
// the NOTIFY lock behind other notifying commits must not hold the round
// back for long. The Locker's other leases keep their heartbeat period.
func testHeartbeatBehindUnlocksOnABusyNotificationQueue(t *testing.T) {
	t.Parallel()
	srv := pgtest.CrashableServer(t)
	ctx := pgtest.Ctx(t)
	table := pgtest.DurableTable(t, srv)
	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	_, err := pool.Exec(ctx, "CREATE TABLE busy (n int)")
	require.NoError(t, err)
	notifyLoad(t, srv.DSN(), 8, 50*time.Millisecond)

	const interval = 100 * time.Millisecond
	rounds := &roundCounter{}
	l := pgtest.Locker(t, pool, table, "gate", pglease.WithTTL(5*time.Second),
		pglease.WithHeartbeatInterval(interval), pglease.WithHook(rounds.hook))
	// Unlocks alone, whatever the run's coalescing switch: the burst form
	// waits for the notification queue's lock without bound (Close's, and
	// coalesced Unlocks').
	pglease.SetCoalesceAll(l, false)
	keep, err := l.Claim(ctx, "kept")
	require.NoError(t, err)

	// The heartbeat's own gaps under this load (its commits wait for the
	// WAL flush the notifiers' commit_delay slows down) are the baseline.
	heldBackHeartbeat(ctx, t, l, rounds, keep, 2*time.Second, 2*interval, 4, "gate", true)
}

// longestGap is the longest time in [from, to] without a round.
func (r *roundCounter) longestGap(from, to time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	var gap time.Duration
	prev := from
	for _, at := range r.times {
		if at.Before(from) || at.After(to) {
			continue
		}
		gap = max(gap, at.Sub(prev))
		prev = at
	}
	return max(gap, to.Sub(prev))
}

// raceReentrantClaimWithUnlock races, 60 times, an Unlock of a lease against
// a re-entrant claim of its key by another Locker storing the same holder
// (as a claim whose reply was lost): the old lease's late release never touches the new
// lease's row (its fence, its liveness, its expiry), and its outcome is
// released (it came first) or ErrLost.
func raceReentrantClaimWithUnlock(ctx context.Context, t *testing.T, pool *pgxpool.Pool, table string) {
	t.Helper()
	oldL := pgtest.Locker(t, pool, table, "same", pglease.WithTTL(5*time.Second))
	newL := pgtest.Locker(t, pool, table, "same", pglease.WithTTL(5*time.Second), pglease.StoredHolder(oldL.Holder()))
	released, lost := 0, 0
	for i := range 60 {
		key := fmt.Sprintf("reentrant-%d", i)
		old, err := oldL.Claim(ctx, key)
		require.NoError(t, err)
		var wg sync.WaitGroup
		var unlockErr error
		var fresh *pglease.Lease
		var claimErr error
		wg.Add(2)
		go func() { defer wg.Done(); unlockErr = old.Unlock(ctx) }()
		go func() { defer wg.Done(); fresh, claimErr = newL.Claim(ctx, key) }()
		wg.Wait()
		require.NoError(t, claimErr)
		switch {
		case unlockErr == nil:
			released++
		case errors.Is(unlockErr, pglease.ErrLost):
			lost++
		default:
			t.Fatalf("Unlock of the old mandate: %v", unlockErr)
		}
		row, ok := pgtest.ReadRow(t, pool, table, key)
		require.True(t, ok)
		require.Equal(t, fresh.Fence(), row.Fence)
		require.True(t, row.Live, "%s: the old mandate's release (outcome %v) expired the new mandate's row", key, unlockErr)
		require.NoError(t, fresh.Err())
		require.True(t, row.ExpiresAt.After(time.Now().Add(3*time.Second)), "%s: the new mandate's row was cut short to %v", key, row.ExpiresAt)
		require.NoError(t, fresh.Unlock(ctx))
	}
	t.Logf("released %d, lost %d", released, lost)
}

// TestLeases pins Locker.Leases: a sorted copy of what is held, with the
// server's times, the trust deadline and what the last round found.
func TestLeases(t *testing.T) {
	t.Parallel()
	// Guarantee: Leases is a copy of the held leases sorted by key, with their
	// server times and trust deadline.
	t.Run("SortedCopyWithServerTimes", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-a", pglease.WithTTL(10*time.Second))
		assert.Empty(t, l.Leases())

		byKey := map[string]*pglease.Lease{}
		for _, key := range []string{"c", "a", "b"} {
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			byKey[key] = lease
		}
		require.NoError(t, byKey["c"].Unlock(ctx))

		got := l.Leases()
		require.Len(t, got, 2, "a released lease is not listed")
		assert.Equal(t, "a", got[0].Key)
		assert.Equal(t, "b", got[1].Key)
		for _, info := range got {
			lease := byKey[info.Key]
			assert.Equal(t, lease.Holder(), info.Holder)
			assert.Equal(t, lease.Fence(), info.Fence)
			assert.True(t, lease.AcquiredAt().Equal(info.AcquiredAt))
			assert.True(t, lease.ExpiresAt().Equal(info.ExpiresAt))
			assert.Equal(t, "confirmed", info.State)
			left := time.Until(info.TrustUntil)
			assert.Positive(t, left)
			assert.Less(t, left, 10*time.Second, "trusted for less than the TTL (10s) from now")
		}
		got[0].Key = "changed"
		assert.Equal(t, "a", l.Leases()[0].Key, "a copy")

		// Safe for concurrent use (the race detector watches).
		var wg sync.WaitGroup
		for i := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				key := fmt.Sprintf("k%d", i)
				lease, err := l.Claim(ctx, key)
				if assert.NoError(t, err) {
					_ = l.Leases()
					assert.NoError(t, lease.Unlock(ctx))
				}
			}()
			_ = l.Leases()
		}
		wg.Wait()
		assert.Len(t, l.Leases(), 2)
	})

	// Guarantee: Leases says when a heartbeat round found the row locked or
	// failed.
	t.Run("SaysWhenARoundFoundTheRowLockedOrFailed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		faulty := pgtest.NewFaultyDB(pool)
		l := pgtest.Locker(t, faulty, table, "replica-a", pglease.WithTTL(5*time.Second),
			pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
		_, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		tx := pgtest.LockRows(t, pool, table, `key = 'k'`)
		require.Eventually(t, func() bool {
			got := l.Leases()
			return len(got) == 1 && got[0].State == "row_locked"
		}, 5*time.Second, 10*time.Millisecond, "a round skips the locked row")
		require.NoError(t, tx.Rollback(ctx))
		require.Eventually(t, func() bool {
			got := l.Leases()
			return len(got) == 1 && got[0].State == "confirmed"
		}, 5*time.Second, 10*time.Millisecond, "the next round extends it again")

		faulty.SetFail("heartbeat", errors.New("injected: connection reset"))
		events.WaitFor(t, pglease.EventHeartbeatFailed, 5*time.Second)
		got := l.Leases()
		require.Len(t, got, 1)
		assert.Equal(t, "retrying", got[0].State)
		faulty.SetFail("heartbeat", nil)
	})
}

// TestLoss is about how a lost lease says what took it.
func TestLoss(t *testing.T) {
	t.Parallel()

	fast := []pglease.Option{pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100 * time.Millisecond)}

	t.Run("RevokeReadsAsRevokedByAnOperator", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		var logs lockedBuffer
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", append(fast, pglease.WithHook(events.Hook), pglease.WithLogger(jsonLogger(&logs)))...)
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)

		_, err = adminOf(t, pool, pglease.WithTable(table)).Revoke(ctx, "k")
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		err = lease.Err()
		t.Logf("revoked: %v", err)
		require.ErrorIs(t, err, pglease.ErrLost, "a revoke is a loss")
		require.ErrorIs(t, err, pglease.ErrRevoked)
		assert.Contains(t, err.Error(), "revoked by an operator")
		assert.NotContains(t, err.Error(), "another holder")

		lost := events.WaitFor(t, pglease.EventLost, time.Second)
		require.ErrorIs(t, lost.Err, pglease.ErrRevoked)
		assert.Equal(t, lease.Fence(), lost.Fence)
		lines := loggedLines(t, &logs, pglease.EventLost)
		require.Len(t, lines, 1)
		assert.Contains(t, lines[0]["error"], "lease revoked by an operator")

		// Its Unlock reports the loss that ended it.
		err = lease.Unlock(ctx)
		require.ErrorIs(t, err, pglease.ErrRevoked)
		require.ErrorIs(t, err, pglease.ErrLost)
	})

	t.Run("UnlockOfARevokedLeaseReadsAsRevoked", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		// No heartbeat round before the Unlock: the release finds the revoke.
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		_, err = adminOf(t, pool, pglease.WithTable(table)).Revoke(ctx, "k")
		require.NoError(t, err)

		err = lease.Unlock(ctx)
		t.Logf("released after revoke: %v", err)
		require.ErrorIs(t, err, pglease.ErrLost)
		require.ErrorIs(t, err, pglease.ErrRevoked)
		assert.Contains(t, err.Error(), "revoked by an operator")
		failed := events.WaitFor(t, pglease.EventReleaseFailed, time.Second)
		require.ErrorIs(t, failed.Err, pglease.ErrRevoked)
	})

	t.Run("ReclaimByAnotherHolderIsNotARevoke", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", fast...)
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE `+table+` SET holder = 'b', fence = fence + 1000 WHERE key = 'k'`)
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		err = lease.Err()
		require.ErrorIs(t, err, pglease.ErrLost)
		require.NotErrorIs(t, err, pglease.ErrRevoked)
		assert.Contains(t, err.Error(), "taken by a later lease (holder b, fence")
	})

	// The heartbeat and the release name an operator's ForceExpire, and
	// claim no other holder: nobody has claimed the key since.
	t.Run("ForceExpireReadsAsForceExpired", func(t *testing.T) {
		t.Parallel()
		for _, by := range []string{"Heartbeat", "Unlock"} {
			t.Run(by, func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				opts := fast
				if by == "Unlock" {
					opts = []pglease.Option{pglease.WithTTL(time.Minute)} // no heartbeat round before the Unlock
				}
				l := pgtest.Locker(t, pool, table, "a", opts...)
				lease, err := l.Claim(ctx, "k")
				require.NoError(t, err)
				_, err = adminOf(t, pool, pglease.WithTable(table)).ForceExpire(ctx, "k")
				require.NoError(t, err)
				if by == "Heartbeat" {
					pgtest.WaitDone(t, lease, 5*time.Second)
					err = lease.Err()
				} else {
					err = lease.Unlock(ctx)
				}
				t.Logf("%s after ForceExpire: %v", by, err)
				require.ErrorIs(t, err, pglease.ErrLost)
				require.NotErrorIs(t, err, pglease.ErrRevoked)
				assert.Contains(t, err.Error(), "expired early by an operator (Admin.ForceExpire)")
				assert.NotContains(t, err.Error(), "another holder")
			})
		}
	})

	t.Run("RevokeOfALaterLeaseIsNotThisLeases", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", fast...)
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		// Another mandate (a new fence) took the row, and an operator then
		// revoked that one: this lease was lost to the other mandate.
		_, err = pool.Exec(ctx, `UPDATE `+table+` SET holder = $1, fence = fence + 1000 WHERE key = 'k'`, sqlstmt.RevokedHolder)
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		err = lease.Err()
		require.ErrorIs(t, err, pglease.ErrLost)
		require.NotErrorIs(t, err, pglease.ErrRevoked)
	})
}
