package pglease_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestUnlock pins that an Unlock waiting on a locked row costs no other
// lease of its Locker.
func TestUnlock(t *testing.T) {
	t.Parallel()
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
		lease, err := l.Claim(ctx, "short")
		require.NoError(t, err)
		tx := pgtest.LockRows(t, pool, table, "key = $1", "short")
		commitAfter(t, tx, 5*time.Millisecond)
		stmts.Reset()
		require.NoError(t, lease.Unlock(ctx))
		assert.Equal(t, 1, stmts.Count("release"), "an Unlock behind a row lock of one commit was sent again")
		row, ok := pgtest.ReadRow(t, pool, table, "short")
		require.True(t, ok)
		assert.False(t, row.Live, "the row is still live after its Unlock")
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
