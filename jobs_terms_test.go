package pglease_test

import (
	"context"
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestJobTerms pins a job's own TTL and min hold: they hold through
// reclaims, give-backs, the heartbeat's watchdog and the skew warning.
func TestJobTerms(t *testing.T) {
	t.Parallel()
	// Guarantee: a lease is never trusted past its own server expiry.
	//
	// Before per-job terms, a re-entrant claim of a key this Locker held wrote
	// an expiry of now + the same TTL, never earlier than what the old lease was
	// trusted for. A job with a shorter TTL breaks that: its re-entrant claim
	// (same holder, so it takes the row) writes clock_timestamp() + the short
	// TTL, taken before it waits on the row lock. When it waits past that TTL,
	// the claim commits an already expired row and returns ErrLost ("expired
	// while waiting on the row lock") without ending the previous lease, which
	// its Locker still trusts for the long TTL. The row is free for any replica
	// at once: two holders believe.
	t.Run("ShortReclaimEndsTheLongLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(30*time.Second), pglease.WithHeartbeatInterval(1900*time.Millisecond))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(30*time.Second))
		short := mustJob(t, a, pglease.WithTTL(4*time.Second), pglease.WithTimeout(20*time.Second))

		long, err := a.Claim(ctx, "k")
		require.NoError(t, err)

		// An operator's (or a guarded job's) transaction holds the row.
		tx := pgtest.LockRows(t, pool, table, `key = 'k'`)

		claimed := make(chan error, 1)
		go func() {
			_, err := short.Claim(ctx, "k") // re-entrant: same holder
			claimed <- err
		}()
		// Past the job's TTL, so that the expiry its claim computed before the
		// wait has passed when it gets the row.
		select {
		case err := <-claimed:
			t.Fatalf("the job's claim returned before the row lock was released: %v", err)
		case <-time.After(4500 * time.Millisecond):
		}
		require.NoError(t, tx.Commit(ctx))
		err = <-claimed
		t.Logf("job's re-entrant claim: %v", err)

		// Another replica claims at once.
		other, errB := b.Claim(ctx, "k")
		longErr := long.Err()
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		t.Logf("row now: %+v; long lease Err=%v; other replica's claim err=%v", row, longErr, errB)
		if errB == nil {
			require.Error(t, longErr, "replica b holds fence %d while the Locker's long lease (fence %d) is still trusted until %v: two holders",
				other.Fence(), long.Fence(), long.ExpiresAt())
		}
		assert.False(t, errB == nil && longErr == nil, "two replicas believe they hold k")
	})

	// Guarantee: another replica cannot claim before acquired_at + min hold. A
	// released lease keeps its row, with this Locker's holder, until its min
	// hold has passed. A ClaimWait of the same key on the same Locker whose
	// context ends while its claim waits on the row lock then gives back what
	// its cancelled claim may have committed (giveBackSQL); matching on holder
	// alone, it would find the released row (a live row of its holder that no
	// lease stands for) and expire it now, min hold or not, and another replica
	// would claim the key within the min hold and run the same tick again.
	t.Run("GiveBackKeepsAReleasedMinHold", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const minHold = 20 * time.Second
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(30*time.Second), pglease.WithMinHold(minHold), pglease.WithTimeout(10*time.Second))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(30*time.Second))

		lease, err := a.Claim(ctx, "tick")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		row, _ := pgtest.ReadRow(t, pool, table, "tick")
		require.True(t, row.Live, "kept for the min hold")
		_, err = b.Claim(ctx, "tick")
		require.ErrorIs(t, err, pglease.ErrHeld, "within the min hold")

		// A transaction holds the row while a's waiting claim is in flight,
		// and the waiter gives up.
		tx := pgtest.LockRows(t, pool, table, `key = 'tick'`)
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		defer cancel()
		waited := make(chan error, 1)
		go func() {
			_, err := a.ClaimWait(wctx, "tick")
			waited <- err
		}()
		// The waiter gives up. Its give-back either queues behind the row lock
		// (a give-back that would touch the released row) or passes the row by
		// and lets ClaimWait return: then the transaction ends.
		var waitErr error
		returned := false
		require.Eventually(t, func() bool {
			select {
			case waitErr = <-waited:
				returned = true
				return true
			default:
			}
			var n int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
			WHERE wait_event_type = 'Lock' AND query LIKE '%acquired_at + interval ''1 microsecond''%RETURNING pg_notify%'
			  AND query NOT LIKE '%unnest%'`).Scan(&n))
			return n > 0
		}, 15*time.Second, 10*time.Millisecond, "the waiter gave up")
		require.NoError(t, tx.Commit(ctx))
		if !returned {
			waitErr = <-waited
		}
		t.Logf("ClaimWait: %v", waitErr)

		row, _ = pgtest.ReadRow(t, pool, table, "tick")
		heldFor := row.ExpiresAt.Sub(row.AcquiredAt)
		t.Logf("row after the waiter gave up: %+v (held %v after its claim)", row, heldFor)
		_, err = b.Claim(ctx, "tick")
		assert.ErrorIs(t, err, pglease.ErrHeld, "b claimed the key %v after a's claim, within a's min hold of %v", time.Since(row.AcquiredAt).Round(time.Millisecond), minHold)
	})

	// Guarantee: the watchdog
	// checks every lease each trust margin of the shortest TTL, "the Locker's
	// or a job's". Job lowers that TTL, but a watchdog already sleeping keeps
	// the slice of the Locker's long TTL (1s) for its current sleep. A job
	// lease whose wall-clock deadline a suspend (ShiftWallClock) has passed
	// keeps its Done open, and its job's Context running, for up to that old
	// slice rather than the job's own margin (200ms for a 2s TTL).
	// Timing-based: it measures how long Done takes after the jump.
	t.Run("WatchdogSliceIsTheJobsOwn", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(60*time.Second), pglease.WithHeartbeatInterval(900*time.Millisecond))
		_, err := l.Claim(ctx, "daily") // the watchdog sleeps 1s slices (margin of 60s)
		require.NoError(t, err)
		job := mustJob(t, l, pglease.WithTTL(2*time.Second))
		short, err := job.Claim(ctx, "frequent")
		require.NoError(t, err)

		pglease.ShiftWallClock(l, 10*time.Second) // the host was suspended
		jumped := time.Now()
		select {
		case <-short.Done():
		case <-time.After(5 * time.Second):
			t.Fatal("job lease never ended after its wall-clock deadline passed")
		}
		took := time.Since(jumped)
		t.Logf("job lease ended %v after the jump", took)
		assert.Less(t, took, 400*time.Millisecond, "a 2s job lease should end within two of its watchdog slices (200ms) of a jump past its deadline")
	})

	// Guarantee: a clock skew that defeats a job's min hold goes
	// unreported. The warning bound is half the Locker's min hold (1s without
	// one), but a job may have its own, shorter min hold (Locker.Job): the
	// Locker is skewed by 700ms, beyond half the job's 400ms min hold, so
	// replicas of this job would run the same tick twice, yet nothing warns.
	t.Run("SkewBeyondHalfTheMinHoldIsWarned", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		logs := &lockedBuffer{}
		l := pgtest.Locker(t, pool, table, "skewed", pglease.WithHeartbeatInterval(time.Second),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
		job := mustJob(t, l, pglease.WithTTL(10*time.Second), pglease.WithMinHold(400*time.Millisecond))

		pglease.ShiftWallClock(l, 700*time.Millisecond)
		for i := range 3 {
			_, err := job.Claim(ctx, fmt.Sprintf("job-%d", i))
			require.NoError(t, err)
		}
		s, ok := l.ClockSkew()
		require.True(t, ok)
		t.Logf("reading %+v, beyond %v", s, s.Beyond())
		require.Greater(t, s.Beyond(), 200*time.Millisecond, "the reading itself sees the skew")
		assert.Equal(t, 1, logs.count(skewWarning), "skew %v beyond half the job's min hold (200ms) must warn:\n%s", s.Offset, logs.String())
	})

	// Guarantee: claims that wait long on a row lock
	// (an operator's transaction) have a long round trip; the skew reading
	// must not turn that wait into a skew beyond half a tiny min hold (10ms).
	t.Run("SlowClaimsDoNotWarnOfSkew", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		logs := &lockedBuffer{}
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(10*time.Second), pglease.WithMinHold(20*time.Millisecond),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(time.Second))
		for i := range 3 {
			key := fmt.Sprintf("k%d", i)
			lb, err := b.Claim(ctx, key)
			require.NoError(t, err)
			require.NoError(t, lb.Unlock(ctx))
			tx := pgtest.LockRows(t, pool, table, `key = $1`, key)
			got := make(chan error, 1)
			go func() { _, err := a.Claim(ctx, key); got <- err }()
			select {
			case err := <-got:
				t.Fatalf("claim returned through a row lock: %v", err)
			case <-time.After(time.Duration(100*(i+1)) * time.Millisecond):
			}
			require.NoError(t, tx.Commit(ctx))
			require.NoError(t, <-got)
			s, _ := a.ClockSkew()
			t.Logf("reading after a claim that waited: %+v beyond %v", s, s.Beyond())
		}
		assert.Zero(t, logs.count(skewWarning), logs.String())
	})
}
