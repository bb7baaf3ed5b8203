package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee 1's limit and 4's promise that a loss names its cause:
// SKIP LOCKED skips row locks, not a table lock. An operator's LOCK TABLE
// (or an ALTER TABLE queued behind a long query) holds every heartbeat
// round, and every lease of the Locker is lost at its trust deadline, with
// the database up and the pool idle. The loss must say what held the
// heartbeat (a round in flight, waiting on the server), not read like a
// plain silence of the heartbeat.
func TestLeasesLostBehindATableLockSayTheHeartbeatWasInFlight(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const ttl = time.Second
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
	var leases []*pglease.Lease
	for _, key := range []string{"a", "b", "c"} {
		lease, err := l.Claim(ctx, key)
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	_, end := lockTable(t, pool, table)
	defer end(false)
	for _, lease := range leases {
		pgtest.WaitDone(t, lease, 3*ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
	}
	msg := leases[0].Err().Error()
	require.Regexp(t, `(?i)in flight|lock|no reply|outstanding`, msg, "the loss names what held the heartbeat")
}
