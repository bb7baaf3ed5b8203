package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// Go's monotonic clock, and its timers, stand still while a host or VM is
// suspended; the wall clock does not. These tests simulate a suspend by
// moving only the Locker's wall clock (ShiftWallClock, export_test.go).

// TestWallClock pins trust against the wall clock: a jump past a lease's
// trust deadline ends the lease at once, and a step back never stretches
// the trust beyond the monotonic deadline.
func TestWallClock(t *testing.T) {
	t.Parallel()
	// Guarantee: a lease ends within a heartbeat slice when the wall clock jumps
	// past its trust deadline, as after a suspend.
	t.Run("JumpPastTheTrustDeadlineEndsTheLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		// The heartbeat is due only after the bound below, and the monotonic
		// trust deadline (9s) long after: only the watchdog, every margin
		// (1s), can notice the jump in time.
		const ttl, interval, bound = 10 * time.Second, 4 * time.Second, 3 * time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "sleeper", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		jobCtx, cancel := lease.Context(ctx)
		defer cancel()

		// The host sleeps for a TTL; on resume the monotonic clock has not
		// moved, the wall clock has, and the server expired the lease.
		pglease.ShiftWallClock(l, ttl)

		pgtest.WaitDone(t, lease, bound) // before anything calls Err
		select {
		case <-jobCtx.Done():
		default:
			t.Fatal("Done is closed but the job's context is not cancelled")
		}
		require.ErrorIs(t, context.Cause(jobCtx), pglease.ErrLost, "the job's context is cancelled with the loss as cause")
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		ev := events.WaitFor(t, pglease.EventLost, time.Second)
		assert.Equal(t, lease.Fence(), ev.Fence)
		_, held := l.Held("k")
		assert.False(t, held)
	})

	// Guarantee: Err reports the lease lost at once after a wall-clock jump past
	// its trust deadline.
	t.Run("ErrReportsTheLossAtOnceAfterAJump", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "sleeper", pglease.WithTTL(time.Minute))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, lease.Err())

		pglease.ShiftWallClock(l, time.Minute)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost, "no need to wait for any timer")
		_, held := l.Held("k")
		assert.False(t, held)
	})

	// Guarantee: a wall clock stepped back does not stretch trust beyond the
	// monotonic deadline.
	t.Run("SteppedBackDoesNotStretchTrust", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		proxy := pgtest.Proxy(t, "")
		const ttl = time.Second
		l := pgtest.Locker(t, pgtest.AppPool(t, "", proxy, pgtest.AppName("stepback")), table, "stepped",
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithTimeout(time.Second))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		claimed := time.Now()

		// No heartbeat gets through, and the wall clock is stepped an hour
		// back: the monotonic deadline still ends the lease before the
		// server's expiry.
		proxy.SetMode(faultproxy.Blackhole)
		pglease.ShiftWallClock(l, -time.Hour)
		pgtest.WaitDone(t, lease, 3*ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		assert.Less(t, time.Since(claimed), 2*ttl, "lost at its monotonic deadline, not an hour later")
		row, _ := pgtest.ReadRow(t, direct, table, "k")
		require.Equal(t, lease.Fence(), row.Fence)
		proxy.SetMode(faultproxy.Forward)
	})
}
