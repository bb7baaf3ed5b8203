package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee 1 (one locked row costs nothing it need not): the
// heartbeat locks its rows FOR UPDATE SKIP LOCKED. FOR UPDATE conflicts with
// FOR KEY SHARE, the lock every foreign key check takes on the referenced
// row, while the UPDATE itself (it changes no key column) takes only FOR NO
// KEY UPDATE, which does not. A job that, in its own transaction, writes a
// row referencing its lease's key (an audit or run table with a foreign key
// to the lease table) makes its own lease be skipped round after round, and
// lost at its trust deadline, although extending it would not have waited
// at all.
func TestHeartbeatExtendsALeaseWhoseRowIsOnlyKeyShareLocked(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	tbl := pgx.Identifier{table}.Sanitize()
	child := pgx.Identifier{table + "_runs"}.Sanitize()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE TABLE %s (id bigserial PRIMARY KEY, lease_key text NOT NULL REFERENCES %s (key))`, child, tbl))
	require.NoError(t, err)

	const ttl = time.Second
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
	lease, err := l.Claim(ctx, "k")
	require.NoError(t, err)

	// The job records its run in its own transaction, left open while it
	// works: the foreign key check holds FOR KEY SHARE on the lease's row.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (lease_key) VALUES ('k')`, child))
	require.NoError(t, err)

	// Proof that extending the row does not have to wait: the heartbeat's
	// own UPDATE, run alone, goes through at once.
	probe, err := pool.Begin(ctx)
	require.NoError(t, err)
	pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	_, err = probe.Exec(pctx, fmt.Sprintf(`UPDATE %s SET expires_at = expires_at + interval '1 second' WHERE key = 'k'`, tbl))
	cancel()
	require.NoError(t, err, "an UPDATE of expires_at does not wait on FOR KEY SHARE")
	require.NoError(t, probe.Rollback(ctx))

	// The job runs for three TTLs; its lease must stay held throughout.
	deadline := time.Now().Add(3 * ttl)
	for time.Now().Before(deadline) {
		select {
		case <-lease.Done():
			t.Fatalf("lease lost while its row was only FOR KEY SHARE locked (extended %d rounds): %v",
				events.Count(pglease.EventExtended), lease.Err())
		case <-time.After(50 * time.Millisecond):
		}
	}
	require.NoError(t, lease.Err())
	require.NoError(t, tx.Commit(ctx))
}

// Guarantee 2 (Close releases every held lease in one statement
// within its timeout): the batched release is a plain UPDATE, which waits
// on any row lock. One row locked by an operator's open transaction holds
// the whole statement until Close's timeout cancels it, and every other
// lease of the Locker stays held on the server until its expiry (a full
// TTL) instead of being handed over.
func TestCloseReleasesTheOtherLeasesWhenOneRowIsLocked(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTimeout(time.Second))
	const n = 20
	for i := range n {
		_, err := l.Claim(ctx, fmt.Sprintf("k%02d", i))
		require.NoError(t, err)
	}
	end := lockRow(t, pool, table, "k00")
	defer end(false)

	start := time.Now()
	err := l.Close(ctx)
	took := time.Since(start)
	var stillHeld []string
	for i := 1; i < n; i++ {
		key := fmt.Sprintf("k%02d", i)
		if row, _ := pgtest.ReadRow(t, pool, table, key); row.Live {
			stillHeld = append(stillHeld, key)
		}
	}
	require.Empty(t, stillHeld, "Close took %v (err %v); rows of unlocked leases still live after Close, held until their expiry (60s)", took, err)
}

// Guarantee 1 via the round gate: a release (Unlock) is a plain
// UPDATE that waits on the row lock, and while it is in flight the gate
// keeps every heartbeat round out. With WithTimeout at its default (5s) and
// a TTL of 2s, an Unlock of one locked row makes every other lease of the
// Locker lost, with the database healthy and their rows free.
func TestUnlockOfALockedRowCostsNoOtherLease(t *testing.T) {
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
}
