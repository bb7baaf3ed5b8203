package pglease_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/driver/fakedriver"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestLockerLogic runs Lockers on the in-memory driver (fakedriver), with
// no server: what a Locker does with each outcome of its statements, the
// order of its heartbeat against its releases, its trust deadline and its
// Close. The database tests prove the statements; these, the logic above.
func TestLockerLogic(t *testing.T) {
	t.Parallel()
	const ttl = 300 * time.Millisecond
	// newLocker is a Locker of holder on tbl, and its driver.
	newLocker := func(t *testing.T, tbl *fakedriver.Table, holder string) (*pglease.Locker, *fakedriver.Driver) {
		t.Helper()
		var d *fakedriver.Driver
		l, err := pglease.NewLockerOn(func(h string) driver.Protocol {
			d = tbl.Protocol(h)
			return d
		}, pglease.WithHolder(holder), pglease.WithTTL(ttl), pglease.WithLogger(pgtest.Quiet))
		require.NoError(t, err)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		return l, d
	}
	// lost is a reply lost after the statement ran: its outcome is unknown.
	lost := errors.New("connection reset by peer")

	t.Run("ClaimOfUnknownOutcomeIsGivenBack", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		l, d := newLocker(t, tbl, "a")
		d.FailNext(fakedriver.Claim, lost, true)
		d.FailNext(fakedriver.ClaimAll, lost, true)
		_, err := l.Claim(ctx, "k")
		require.ErrorIs(t, err, lost)
		row, ok := tbl.Row("k")
		require.True(t, ok, "the claim ran: its row is there")
		require.Equal(t, l.Holder(), row.Holder)
		require.Eventually(t, func() bool { r, _ := tbl.Row("k"); return !r.Live }, 5*time.Second, time.Millisecond,
			"the Locker gives the row it may have taken back, on the fence it drew")
		b, _ := newLocker(t, tbl, "b")
		lease, err := b.Claim(ctx, "k")
		require.NoError(t, err, "another holder claims the key at once, without waiting for the TTL")
		assert.Greater(t, lease.Fence(), row.Fence)
	})

	t.Run("ClaimNeverSentWritesNothingAndHandsNothingOut", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		l, d := newLocker(t, tbl, "a")
		refused := driver.NotSentError(errors.New("no connection"))
		d.FailNext(fakedriver.Claim, refused, false)
		d.FailNext(fakedriver.ClaimAll, refused, false)
		_, err := l.Claim(ctx, "k")
		require.Error(t, err)
		_, ok := tbl.Row("k")
		require.False(t, ok, "nothing was written")
	})

	t.Run("ServerErrorIsReturnedAndNoLeaseHandedOut", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		l, d := newLocker(t, tbl, "a")
		pgErr := &pgconn.PgError{Code: "53300", Message: "too many connections"}
		d.FailNext(fakedriver.Claim, pgErr, false)
		d.FailNext(fakedriver.ClaimAll, pgErr, false)
		_, err := l.Claim(ctx, "k")
		var got *pgconn.PgError
		require.ErrorAs(t, err, &got)
		require.Equal(t, "53300", got.Code)
		_, ok := tbl.Row("k")
		require.False(t, ok)
	})

	t.Run("HeldKeyIsErrHeld", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, _ := newLocker(t, tbl, "a")
		b, _ := newLocker(t, tbl, "b")
		_, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		_, err = b.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld)
	})

	t.Run("HeartbeatEndsALeaseAnotherHolderTook", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, _ := newLocker(t, tbl, "a")
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		// The server's clock jumps past the lease's expiry (a's heartbeat
		// stalled, as far as the server knows): b takes the key.
		tbl.Advance(time.Hour)
		b, _ := newLocker(t, tbl, "b")
		taken, err := b.Claim(ctx, "k")
		require.NoError(t, err)
		select {
		case <-lease.Done():
		case <-ctx.Done():
			t.Fatal("a's heartbeat never noticed the row taken")
		}
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		select {
		case <-taken.Done():
			t.Fatal("b's lease ended: ", taken.Err())
		default:
		}
	})

	// Done is made by its first call: asked before the end or after it, it
	// is closed once the end is reported, never before.
	t.Run("DoneClosesOnceTheEndIsReportedWhenAskedBeforeOrAfter", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		var lostReported atomic.Bool
		a, err := pglease.NewLockerOn(func(h string) driver.Protocol { return tbl.Protocol(h) }, pglease.WithHolder("a"), pglease.WithTTL(ttl), pglease.WithLogger(pgtest.Quiet),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventLost {
					lostReported.Store(true)
				}
			}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = a.Close(context.Background()) })
		closed := func(done <-chan struct{}) bool {
			select {
			case <-done:
				return true
			default:
				return false
			}
		}

		before, err := a.Claim(ctx, "before")
		require.NoError(t, err)
		done := before.Done()
		require.False(t, closed(done), "Done of a held lease")
		require.Equal(t, done, before.Done(), "every call returns the one channel")
		require.NoError(t, before.Unlock(ctx))
		require.True(t, closed(done), "Done asked before Unlock is closed once Unlock returned")

		after, err := a.Claim(ctx, "after")
		require.NoError(t, err)
		require.NoError(t, after.Unlock(ctx))
		require.True(t, closed(after.Done()), "Done asked only after Unlock is closed")

		lost, err := a.Claim(ctx, "lost")
		require.NoError(t, err)
		done = lost.Done()
		tbl.Advance(time.Hour)
		b, _ := newLocker(t, tbl, "b")
		_, err = b.Claim(ctx, "lost")
		require.NoError(t, err)
		select {
		case <-done:
		case <-ctx.Done():
			t.Fatal("a's heartbeat never noticed the row taken")
		}
		require.True(t, lostReported.Load(), "whoever sees Done closed finds the loss reported")
	})

	t.Run("ReleaseWaitsForTheHeartbeatInFlight", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, d := newLocker(t, tbl, "a")
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		gate := d.Hold(fakedriver.Extend, false)
		<-gate.Arrived() // a heartbeat round waits to run
		unlocked := make(chan error, 1)
		go func() { unlocked <- lease.Unlock(ctx) }()
		select {
		case err := <-unlocked:
			t.Fatalf("Unlock returned (%v) while a heartbeat round was in flight: the round could extend the released row", err)
		case <-time.After(50 * time.Millisecond):
		}
		gate.Open()
		require.NoError(t, <-unlocked)
		row, _ := tbl.Row("k")
		require.False(t, row.Live, "the release came after the round: the row is expired")
		require.ErrorIs(t, lease.Err(), pglease.ErrReleased)
	})

	t.Run("LeaseEndsAtItsTrustDeadlineWhenNoHeartbeatGetsThrough", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, d := newLocker(t, tbl, "a")
		for range 200 {
			d.FailNext(fakedriver.Extend, driver.NotSentError(errors.New("no connection")), false)
		}
		began := time.Now()
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		select {
		case <-lease.Done():
		case <-ctx.Done():
			t.Fatal("the lease outlived every failed heartbeat")
		}
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.Less(t, time.Since(began), ttl+time.Second, "the Locker stops trusting the lease within its TTL")
		row, _ := tbl.Row("k")
		require.True(t, row.Live, "the server never heard of the loss: only the Locker's own deadline ended the lease")
	})

	t.Run("CloseReleasesEveryLeaseAndRefusesLaterClaims", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, _ := newLocker(t, tbl, "a")
		var leases []*pglease.Lease
		for _, key := range []string{"k1", "k2", "k3"} {
			lease, err := a.Claim(ctx, key)
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		require.NoError(t, a.Close(ctx))
		require.NoError(t, a.Close(ctx), "Close is idempotent")
		for _, lease := range leases {
			require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
			row, _ := tbl.Row(lease.Key())
			require.False(t, row.Live, "%s: released by Close", lease.Key())
		}
		_, err := a.Claim(ctx, "k4")
		require.ErrorIs(t, err, pglease.ErrClosed)
	})

	t.Run("BurstOfUnknownOutcomeIsGivenBackKeyByKey", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		l, d := newLocker(t, tbl, "a")
		d.FailNext(fakedriver.ClaimAll, lost, true)
		keys := []string{"k1", "k2", "k3"}
		_, errs := pglease.ClaimBurst(ctx, l, keys)
		for i, err := range errs {
			require.ErrorIs(t, err, lost, "claim of %s", keys[i])
		}
		for _, key := range keys {
			row, ok := tbl.Row(key)
			require.True(t, ok, "%s: the burst ran", key)
			require.Equal(t, l.Holder(), row.Holder)
		}
		require.Eventually(t, func() bool {
			for _, key := range keys {
				if r, _ := tbl.Row(key); r.Live {
					return false
				}
			}
			return true
		}, 5*time.Second, time.Millisecond, "each row the burst may have taken is given back")
	})

	// A claim held before it runs and ended by Close has an unknown
	// outcome (sent, never answered): Close finds no row of it, cannot
	// know that none will come, and names the key.
	t.Run("CloseEndsAClaimInFlight", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		l, d := newLocker(t, tbl, "a")
		alone, burst := d.Hold(fakedriver.Claim, false), d.Hold(fakedriver.ClaimAll, false)
		claimed := make(chan error, 1)
		go func() {
			_, err := l.Claim(ctx, "k")
			claimed <- err
		}()
		select { // the claim is on its way, held before it runs
		case <-alone.Arrived():
		case <-burst.Arrived():
		}
		err := l.Close(ctx)
		require.ErrorContains(t, err, `claim "k" may have written a row that could not be expired again`)
		require.ErrorContains(t, err, "outcome is unknown and no row of it was there to expire")
		select {
		case err := <-claimed:
			require.ErrorIs(t, err, pglease.ErrClosed, "Close ended the claim")
		case <-ctx.Done():
			t.Fatal("the claim in flight outlived Close")
		}
		_, ok := tbl.Row("k")
		require.False(t, ok, "the claim ended before it ran: nothing written")
	})

	t.Run("ElectorHandsOverWhenTheLeaderCloses", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		tbl := fakedriver.NewTable()
		a, _ := newLocker(t, tbl, "a")
		b, _ := newLocker(t, tbl, "b")
		ea, err := pglease.NewElector(a, "leader")
		require.NoError(t, err)
		eb, err := pglease.NewElector(b, "leader")
		require.NoError(t, err)
		t.Cleanup(func() { _ = eb.Close(context.Background()) })
		led, err := ea.Campaign(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, eb.IsLeader(ctx), pglease.ErrHeld, "one leader")
		follower := make(chan *pglease.Lease, 1)
		go func() {
			lease, err := eb.Campaign(ctx)
			assert.NoError(t, err)
			follower <- lease
		}()
		require.NoError(t, ea.Close(ctx))
		require.ErrorIs(t, led.Err(), pglease.ErrClosed)
		select {
		case lease := <-follower:
			require.NotNil(t, lease)
			require.Greater(t, lease.Fence(), led.Fence(), "the new leader's fence is greater")
			row, _ := tbl.Row("leader")
			require.Equal(t, b.Holder(), row.Holder)
			require.True(t, row.Live)
		case <-ctx.Done():
			t.Fatal("the follower never took over")
		}
	})
}
