package pglease_test

import (
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: a released lease stays held until acquired_at + its min hold,
// so that a replica whose scheduler fires later cannot run the same tick,
// even when a ClaimWait of the same key fails and gives back what its claim
// may have committed. A job's released row whose min hold equals the
// Locker's TTL looks exactly like an unreleased claim of the Locker's TTL
// (expires_at = acquired_at + that duration); its give-back must keep the
// job's min hold.
func TestGiveBackOfAFailedClaimWaitKeepsAJobsMinHold(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	faulty := pgtest.NewFaultyDB(pool)

	l := pgtest.Locker(t, faulty, table, "a", pglease.WithTTL(3*time.Second))
	job, err := l.Job(pglease.WithTTL(6*time.Second), pglease.WithMinHold(3*time.Second))
	require.NoError(t, err)

	lease, err := job.Claim(ctx, "tick")
	require.NoError(t, err)
	require.NoError(t, lease.Unlock(ctx))
	before, ok := pgtest.ReadRow(t, pool, table, "tick")
	require.True(t, ok)
	require.True(t, before.Live, "the released job lease is kept for its min hold")
	require.Equal(t, before.AcquiredAt.Add(3*time.Second), before.ExpiresAt)

	faulty.SetFail("claim", errors.New("connection reset by peer"))
	_, err = l.ClaimWait(ctx, "tick")
	require.Error(t, err)
	faulty.SetFail("claim", nil)

	after, ok := pgtest.ReadRow(t, pool, table, "tick")
	require.True(t, ok)
	require.Equal(t, before.ExpiresAt, after.ExpiresAt,
		"a ClaimWait whose claim wrote nothing changed the released job lease's expiry (min hold cut by %v)", before.ExpiresAt.Sub(after.ExpiresAt))

	other := pgtest.Locker(t, pool, table, "b")
	_, err = other.Claim(ctx, "tick")
	require.ErrorIs(t, err, pglease.ErrHeld, "another replica took the tick within the job's min hold")
}
