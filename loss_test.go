package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

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
		assert.Contains(t, err.Error(), "re-claimed or lapsed")
	})

	t.Run("RevokeOfALaterMandateIsNotThisLeases", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "a", fast...)
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		// Another mandate (a new fence) took the row, and an operator then
		// revoked that one: this lease was lost to the other mandate.
		_, err = pool.Exec(ctx, `UPDATE `+table+` SET holder = $1, fence = fence + 1000 WHERE key = 'k'`, pglease.RevokedHolder)
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		err = lease.Err()
		require.ErrorIs(t, err, pglease.ErrLost)
		require.NotErrorIs(t, err, pglease.ErrRevoked)
	})
}
