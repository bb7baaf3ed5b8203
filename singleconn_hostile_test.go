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

// Guarantee: DB's documentation says a *pgx.Conn satisfies it, and a Locker
// on one works. A *pgx.Conn runs one statement at a time and is not safe
// for concurrent use, while a Locker sends statements from its heartbeat
// goroutine and from every caller of Claim and Unlock (gocron calls Lock
// and Unlock from a goroutine per job). Claims and releases made while the
// heartbeat runs must neither fail with "conn busy" nor race on the
// connection's buffers, and no lease may be lost while the server is fine.
func TestLockerOnASingleConnectionClaimsAndReleasesWhileTheHeartbeatRuns(t *testing.T) {
	t.Parallel()
	ctx, _, table := pgtest.Setup(t)
	conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })

	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, conn, table, "single", pglease.WithTTL(2*time.Second),
		pglease.WithHeartbeatInterval(5*time.Millisecond), pglease.WithHook(events.Hook))
	// One lease held throughout keeps the heartbeat busy.
	held, err := l.Claim(ctx, "held")
	require.NoError(t, err)

	var failures []error
	for i := range 300 {
		lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i%5))
		if err != nil {
			failures = append(failures, fmt.Errorf("claim %d: %w", i, err))
			continue
		}
		if err := lease.Unlock(ctx); err != nil {
			failures = append(failures, fmt.Errorf("unlock %d: %w", i, err))
		}
	}
	t.Logf("figures: 300 claim+unlock on one *pgx.Conn with a 5ms heartbeat: %d failed, %d heartbeat rounds failed, %d leases lost",
		len(failures), events.Count(pglease.EventHeartbeatFailed), events.Count(pglease.EventLost))
	if len(failures) > 0 {
		t.Errorf("claims and releases on a *pgx.Conn while the heartbeat runs: %d of 300 failed, first: %v", len(failures), failures[0])
	}
	require.Zero(t, events.Count(pglease.EventHeartbeatFailed), "heartbeat rounds failed on a *pgx.Conn")
	require.NoError(t, held.Err())
}
