package pglease_test

import (
	"errors"
	"testing"
	"time"

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
		end := lockRow(t, pool, table, "locked")
		defer end(false)

		start := time.Now()
		uerr := locked.Unlock(ctx)
		took := time.Since(start)
		require.NoError(t, other.Err(), "lease %q, whose row nobody locked, after Unlock of %q took %v (%v)", other.Key(), locked.Key(), took, uerr)
	})
}
