package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestUnlockWaitsOutARowLockOfOneCommitAndSkipsALongOne: a claim of
// another replica that met the row as it changed hands locks it for one
// commit; an Unlock meeting that lock waits it out and releases in one
// statement, rather than being sent again and again while replicas keep
// claiming. A row locked for long (an operator's or a guarded job's
// transaction) is skipped after a short wait, not waited on: the Locker's
// heartbeat keeps its period meanwhile, and the Unlock releases the row
// once the transaction ends.
func TestUnlockWaitsOutARowLockOfOneCommitAndSkipsALongOne(t *testing.T) {
	t.Parallel()
	ctx, pool, table, stmts := pgtest.SetupCounted(t)

	t.Run("OneCommit", func(t *testing.T) {
		l := pgtest.Locker(t, pool, table, "short")
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

	t.Run("LongTransaction", func(t *testing.T) {
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
