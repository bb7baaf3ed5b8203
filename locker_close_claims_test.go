package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestCloseNamesWhatClaimsLeftBehind: Close returns nil only when no claim
// in flight as it began (ended by it, or still giving back what it may
// have written) can leave a live row of the Locker's holder, now or once
// traffic held on the network arrives; otherwise its error names each key.
// A claim statement is held on its way to the server (pgtest.HoldSend) and
// delivered once Close has returned.
func TestCloseNamesWhatClaimsLeftBehind(t *testing.T) {
	t.Parallel()

	// Guarantee: Close returns nil only when it left no row of its holder
	// live, also of a claim whose statement had not reached the server yet:
	// on a wrapper, whose connections the Locker cannot watch, Close ends a
	// claim whose statement is held on its way, finds nothing to expire, and
	// names the key; the statement, delivered after Close, commits that row.
	t.Run("NamesAClaimTheServerMayStillRun", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		hold.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, hold)
		err := l.Close(ctx)
		requireNamedUnknown(t, err, "k1")
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		_, ok := pgtest.ReadRow(t, admin, table, "k1")
		require.False(t, ok, "the claim's statement reached the server before it was delivered")
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), 0)
	})

	// Guarantee: the same when the key's row is the Locker's own from an
	// earlier lease, released, whose fence the Locker no longer keeps (past
	// that lease's TTL): that row is no proof that the claim Close ended
	// ran. On a pool (its statement under a cancel request), on a wrapper,
	// and for a job of ticks, whose runs release their rows as they end.
	for _, c := range []struct {
		name string
		wrap func(*pgxpool.Pool) pglease.DB
		job  bool
	}{
		{"NamesAClaimPastItsOwnReleasedRowOnAPool", func(p *pgxpool.Pool) pglease.DB { return p }, false},
		{"NamesAClaimPastItsOwnReleasedRowOnAWrapper", func(p *pgxpool.Pool) pglease.DB { return pgtest.NewFaultyDB(p) }, false},
		{"NamesATickPastTheRowOfTheRunBefore", func(p *pgxpool.Pool) pglease.DB { return pgtest.NewFaultyDB(p) }, true},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, admin, table := pgtest.Setup(t)
			hold := pgtest.NewHoldSend(t, "claim")
			const ttl, period = 2 * time.Second, 3 * time.Second
			l := pgtest.Locker(t, c.wrap(holdPool(t, hold)), table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(time.Second))
			claim := func(ctx context.Context) (*pglease.Lease, error) { return l.Claim(ctx, "k1") }
			pause := ttl + 200*time.Millisecond // the Locker keeps a fence for its lease's TTL
			if c.job {
				j, err := l.Job(pglease.WithPeriod(period))
				require.NoError(t, err)
				claim, pause = func(ctx context.Context) (*pglease.Lease, error) { return j.Claim(ctx, "k1") }, period
			}
			prev, err := claim(ctx)
			require.NoError(t, err)
			require.NoError(t, prev.Unlock(ctx))
			time.Sleep(pause)

			hold.Arm()
			claimed := make(chan error, 1)
			go func() { _, err := claim(ctx); claimed <- err }()
			requireHeld(t, hold)
			err = closeThenDeliver(ctx, l, hold, func() { require.ErrorIs(t, <-claimed, pglease.ErrClosed) })
			requireNamedUnknown(t, err, "k1")
			requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), prev.Fence())
		})
	}

	// Guarantee: a claim whose caller gave up before Close began, and whose
	// give-back is still reading the row when Close begins, is one of the
	// claims Close waits for: Close names it too. The read waits on a row
	// lock until Close has begun, and then finds another holder's row.
	t.Run("NamesAClaimWhoseGiveBackItOvertook", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		x := pgtest.Locker(t, admin, table, "x", pglease.WithTTL(time.Minute))
		ls, err := x.Claim(ctx, "k1")
		require.NoError(t, err)
		require.NoError(t, ls.Unlock(ctx))
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, holdPool(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))

		end := pgtest.LockRow(t, admin, table, "k1")
		hold.Arm()
		cctx, cancel := context.WithCancel(ctx)
		claimed := pgtest.ClaimInBackground(cctx, l, "k1")
		requireHeld(t, hold)
		cancel() // no answer to the cancel requests within a second: the outcome is unknown
		pgtest.LockWaiter(t, admin, "", table, 10*time.Second)
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		require.Eventually(t, func() bool {
			_, err := l.Claim(ctx, "other")
			return errors.Is(err, pglease.ErrClosed)
		}, 5*time.Second, time.Millisecond, "Close has begun")
		end(false)
		require.ErrorIs(t, (<-claimed).Err, context.Canceled)
		requireNamedUnknown(t, <-closed, "k1")
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), ls.Fence())
	})

	// Guarantee: a row the give-back of an earlier claim of unknown outcome
	// found and expired is no proof for a later claim either, once the
	// registry has forgotten its fence: the Locker counts that fence among
	// those its claims drew.
	t.Run("NamesAClaimPastARowAnEarlierGiveBackExpired", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		drop, hold := pgtest.NewDropReply("claim"), pgtest.NewHoldSend(t, "claim")
		const ttl = 2 * time.Second
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold, drop.Dial)), table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(time.Second))
		drop.Arm()
		_, err := l.Claim(ctx, "k1")
		require.Error(t, err, "the claim's reply was lost")
		<-drop.Dropped
		first, ok := pgtest.ReadRow(t, admin, table, "k1")
		require.True(t, ok && first.Holder == l.Holder() && !first.Live, "the claim's give-back expired its row: %+v", first)
		time.Sleep(ttl + 300*time.Millisecond) // the registry keeps a fence for its lease's TTL

		hold.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, hold)
		err = l.Close(ctx)
		requireNamedUnknown(t, err, "k1")
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), first.Fence)
	})

	// Guarantee: a live row of this holder written late by a claim given up
	// on before (out of Close's scope itself) cannot be told from the row of
	// a claim Close ends: Close expires it, and names the key.
	t.Run("NamesAClaimPastALateRowOfAClaimGivenUpOn", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		early, late := pgtest.NewHoldSend(t, "claim"), pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, early, late.Dial)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		lateRow := lateRowOfAClaimGivenUpOn(ctx, t, l, early, admin, table, "k1")

		late.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, late)
		err := l.Close(ctx)
		requireNamedUnknown(t, err, "k1")
		require.ErrorContains(t, err, "may be an earlier claim's")
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		requireDeliveredLive(t, late, admin, table, "k1", l.Holder(), lateRow.Fence)
	})

	// Guarantee: the same when the give-back of that late row fails and the
	// row lapses before Close reads it last: the claim's own statement may
	// still come, so the note is of the key, not of the row found. A job's
	// claim, whose timeout bounds its give-back's release, held until then.
	t.Run("NamesAClaimPastALateRowThatLapsedWhenItsGiveBackFailed", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		early, late := pgtest.NewHoldSend(t, "claim"), pgtest.NewHoldSend(t, "claim")
		f := pgtest.NewFaultyDB(holdPool(t, early, late.Dial))
		l := pgtest.Locker(t, f, table, "a", pglease.WithTTL(2*time.Second), pglease.WithTimeout(5*time.Second))
		require.NoError(t, l.CheckTable(ctx))
		lateRow := lateRowOfAClaimGivenUpOn(ctx, t, l, early, admin, table, "k1")

		j, err := l.Job(pglease.WithTimeout(700 * time.Millisecond))
		require.NoError(t, err)
		time.Sleep(time.Until(lateRow.ExpiresAt) - 300*time.Millisecond)
		release := f.Hold("release") // the give-back's release, held until its context ends
		t.Cleanup(release)
		late.Arm()
		claimed := make(chan error, 1)
		go func() { _, err := j.Claim(ctx, "k1"); claimed <- err }()
		requireHeld(t, late)
		err = l.Close(ctx)
		requireNamedUnknown(t, err, "k1")
		require.ErrorContains(t, err, "may be an earlier claim's")
		require.ErrorIs(t, <-claimed, pglease.ErrClosed)
		requireDeliveredLive(t, late, admin, table, "k1", l.Holder(), lateRow.Fence)
	})

	// Guarantee: a claim answered while Close closes the Locker's Electors
	// registers no lease (Close has begun) and expires its row itself: when
	// that fails (another transaction locks the row past the release's
	// wait), Close names the key. The Elector's release waits on a row lock
	// until the claim has been answered.
	t.Run("NamesAClaimWhoseRowItCouldNotExpireWhileClosingElectors", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		next, err := admin.Begin(ctx) // locks the claim's row once the claim has committed
		require.NoError(t, err)
		t.Cleanup(func() { _ = next.Rollback(context.Background()) })
		acquired, locked := make(chan struct{}), make(chan error, 1)
		var once sync.Once
		l := pgtest.Locker(t, pgtest.PoolWith(t, pgtest.Server.DSN(), nil), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(2*time.Second),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventAcquired && e.Key == "k1" { // before the claim registers its lease
					once.Do(func() {
						_, err := next.Exec(ctx, fmt.Sprintf(`SELECT 1 FROM %s WHERE key = 'k1' FOR UPDATE`, pgx.Identifier{table}.Sanitize()))
						locked <- err
						close(acquired)
					})
				}
			}))
		el, err := pglease.NewElector(l, "e")
		require.NoError(t, err)
		_, err = el.Campaign(ctx)
		require.NoError(t, err)
		x := pgtest.Locker(t, admin, table, "x")
		ls, err := x.Claim(ctx, "k1")
		require.NoError(t, err)
		require.NoError(t, ls.Unlock(ctx))

		endClaimLock := pgtest.LockRow(t, admin, table, "k1") // the claim waits on it
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		pgtest.LockWaiter(t, admin, "", table, 10*time.Second)
		endElectorLock := pgtest.LockRow(t, admin, table, "e") // the Elector's release waits on it

		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		requireCloseBegun(t, l)
		endClaimLock(false)
		select {
		case <-acquired:
		case <-time.After(10 * time.Second):
			t.Fatal("the claim was never answered")
		}
		require.NoError(t, <-locked)
		endElectorLock(false)
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		err = <-closed
		require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
		require.NoError(t, next.Rollback(ctx))
		row, ok := pgtest.ReadRow(t, admin, table, "k1")
		require.True(t, ok && row.Live && row.Holder == l.Holder(), "the row Close named is live: %+v", row)
	})

	// Guarantee: a claim still in flight as Close begins is Close's to name
	// even when its give-back decided before: the decision travels with the
	// claim until it leaves. A hook holds the claim between its give-back
	// and its return until Close has begun.
	t.Run("NamesAClaimThatLeftAfterItBegan", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		reached, resume := make(chan struct{}), make(chan struct{})
		var once sync.Once
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventClaimFailed && e.Key == "k1" {
					once.Do(func() { close(reached); <-resume })
				}
			}))
		hold.Arm()
		cctx, cancel := context.WithCancel(ctx)
		claimed := pgtest.ClaimInBackground(cctx, l, "k1")
		requireHeld(t, hold)
		cancel()
		select {
		case <-reached:
		case <-time.After(10 * time.Second):
			t.Fatal("the claim never failed")
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		requireCloseBegun(t, l)
		close(resume)
		require.ErrorIs(t, (<-claimed).Err, context.Canceled)
		requireNamedUnknown(t, <-closed, "k1")
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), 0)
	})

	// Guarantee: the same on every way a claim reaches the server: a burst,
	// a waiting claim woken by a release, an Elector's campaign, a
	// *pgx.Conn, database/sql through pgx's stdlib, a table without a fence
	// column, and a re-claim of a key the Locker holds.
	t.Run("NamesAClaimOfABurst", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, holdPool(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		keys := []string{"k1", "k2", "k3"}
		send := pglease.PrepareClaimBurst([]context.Context{ctx, ctx, ctx}, l, keys)
		hold.Arm()
		out := make(chan []error, 1)
		go func() { _, errs := send(); out <- errs }()
		requireHeld(t, hold)
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		for i, err := range <-out {
			require.ErrorIs(t, err, pglease.ErrClosed, keys[i])
		}
		err := <-closed
		for _, key := range keys {
			requireNamedUnknown(t, err, key)
		}
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), 0)
	})
	t.Run("NamesAWaitingClaim", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		x := pgtest.Locker(t, admin, table, "x", pglease.WithTTL(time.Minute))
		xl, err := x.Claim(ctx, "k1")
		require.NoError(t, err)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, holdPool(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		claimed := make(chan error, 1)
		go func() { _, err := l.ClaimWait(ctx, "k1"); claimed <- err }()
		require.Eventually(t, func() bool { return pglease.Waiters(l, "k1") == 1 }, 10*time.Second, time.Millisecond)
		hold.Arm()
		require.NoError(t, xl.Unlock(ctx)) // wakes the waiter: its next attempt is held
		requireHeld(t, hold)
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		require.ErrorIs(t, <-claimed, pglease.ErrClosed)
		requireNamedUnknown(t, <-closed, "k1")
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), xl.Fence())
	})
	t.Run("NamesAnElectorsClaim", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, holdPool(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		el, err := pglease.NewElector(l, "e")
		require.NoError(t, err)
		hold.Arm()
		campaigned := make(chan error, 1)
		go func() { _, err := el.Campaign(ctx); campaigned <- err }()
		requireHeld(t, hold)
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		require.ErrorIs(t, <-campaigned, pglease.ErrClosed)
		requireNamedUnknown(t, <-closed, "e")
		requireDeliveredLive(t, hold, admin, table, "e", l.Holder(), 0)
	})
	for _, c := range []struct {
		name string
		db   func(t *testing.T, hold *pgtest.HoldSend) pglease.DB
	}{
		{"NamesAClaimOnAPgxConn", func(t *testing.T, hold *pgtest.HoldSend) pglease.DB {
			t.Helper()
			conn, err := pgx.ConnectConfig(pgtest.Ctx(t), holdConfig(t, hold))
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return conn
		}},
		{"NamesAClaimThroughDatabaseSQL", func(t *testing.T, hold *pgtest.HoldSend) pglease.DB {
			t.Helper()
			db := stdlib.OpenDB(*holdConfig(t, hold))
			t.Cleanup(func() { _ = db.Close() })
			return pglease.SQL(db)
		}},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			ctx, admin, table := pgtest.Setup(t)
			hold := pgtest.NewHoldSend(t, "claim")
			l := pgtest.Locker(t, c.db(t, hold), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
			hold.Arm()
			claimed := pgtest.ClaimInBackground(ctx, l, "k1")
			requireHeld(t, hold)
			closed := make(chan error, 1)
			go func() { closed <- l.Close(ctx) }()
			require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
			hold.Deliver() // the connection's end waits for what it holds
			err := <-closed
			require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
			// Delivered while Close still runs, the statement may meet a cancel
			// request sent for it on its way in, and write nothing: named either way.
			<-hold.Done
			if row, ok := pgtest.ReadRow(t, admin, table, "k1"); ok {
				require.Equal(t, l.Holder(), row.Holder, "the only claim of the key is the one held")
			}
		})
	}
	t.Run("NamesAClaimOnATableWithoutAFenceColumn", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		hold := pgtest.NewHoldSend(t, "claim")
		pool := pgtest.PoolWith(t, dsn, func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			cfg.ConnConfig.DialFunc = hold.Dial(cfg.ConnConfig.DialFunc)
		})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second), pglease.WithoutFenceColumn())
		require.NoError(t, l.CheckTable(ctx))
		hold.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, hold)
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		require.ErrorContains(t, <-closed, `claim "k1" may have written a row that could not be expired again: its claim's outcome is unknown, and a row without a fence cannot be given back`)
	})
	t.Run("NamesAReClaimOfAKeyItHolds", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		held, err := l.Claim(ctx, "k1")
		require.NoError(t, err)
		hold.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, hold)
		err = l.Close(ctx)
		requireNamedUnknown(t, err, "k1")
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), held.Fence())
	})
}

// TestCloseNamesWhatWaitsLeftBehind: a waiting claim, and an Elector's
// campaign, are in flight from their first attempt to their last: what an
// attempt left behind, though that attempt returned before Close began, is
// Close's to name once Close ends the wait.
func TestCloseNamesWhatWaitsLeftBehind(t *testing.T) {
	t.Parallel()

	// An attempt committed a live row but took longer than the trust
	// window, and the release of that row failed; the wait goes on (the
	// key's holder is its own, and later attempts are answered by a server
	// starting up) until Close ends it.
	for _, elector := range []bool{false, true} {
		name := "NamesAWaitingClaimWhoseAttemptLeftALiveRow"
		if elector {
			name = "NamesAnElectorWhoseAttemptLeftALiveRow"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, admin, table := pgtest.Setup(t)
			f := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
			const ttl = 2 * time.Second
			contended := make(chan struct{})
			var once sync.Once
			l := pgtest.Locker(t, f, table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(5*time.Second),
				pglease.WithHook(func(e pglease.Event) {
					if e.Kind == pglease.EventContended && e.Key == "k1" {
						once.Do(func() { close(contended) })
					}
				}))
			x := pgtest.Locker(t, admin, table, "x", pglease.WithTTL(time.Minute))
			xl, err := x.Claim(ctx, "k1")
			require.NoError(t, err)
			waited := make(chan error, 1)
			if elector {
				el, err := pglease.NewElector(l, "k1")
				require.NoError(t, err)
				require.ErrorIs(t, el.IsLeader(ctx), pglease.ErrHeld) // starts the campaign
			} else {
				go func() { _, err := l.ClaimWait(ctx, "k1"); waited <- err }()
			}
			select {
			case <-contended: // the wait has reached the server
			case <-time.After(15 * time.Second):
				t.Fatal("the waiting claim never found the key held")
			}
			release := f.Hold("claim")
			f.SetFail("release", errors.New("the release statement failed"))
			require.NoError(t, xl.Unlock(ctx))
			requireEntered(t, f, "claim")
			time.Sleep(ttl - ttl/20) // past the trust window (ttl - ttl/10), within the TTL
			f.SetFail("claim", &pgconn.PgError{Severity: "FATAL", Code: "57P03", Message: "the database system is starting up"})
			release()
			read := f.Hold("other") // the read that follows the next attempt, answered 57P03
			requireEntered(t, f, "other")
			f.SetFail("release", nil)
			read()
			row, ok := pgtest.ReadRow(t, admin, table, "k1")
			require.True(t, ok && row.Live && row.Holder == l.Holder(), "the slow attempt left a live row of the holder: %+v", row)

			err = l.Close(ctx)
			require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
			require.ErrorContains(t, err, "the release statement failed")
			if !elector {
				require.ErrorIs(t, <-waited, pglease.ErrClosed)
			}
		})
	}

	// The same with network faults alone, on a pool: the attempt's
	// statement is held on its way past the trust window, and its
	// give-back's release is lost to a reset connection; the wait then
	// pauses (the row it read is its own) and Close begins.
	t.Run("NamesAWaitingClaimWhoseAttemptLeftALiveRowOnAPool", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold, fail := pgtest.NewHoldSend(t, "claim"), pgtest.NewFailSend("release")
		const ttl = 2 * time.Second
		settled := make(chan struct{})
		var once sync.Once
		l := pgtest.Locker(t, holdPool(t, hold, fail.Dial), table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(5*time.Second),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventClaimFailed && e.Key == "k1" {
					once.Do(func() { close(settled) })
				}
			}))
		require.NoError(t, l.CheckTable(ctx))
		hold.Arm()
		fail.Arm()
		waited := make(chan error, 1)
		go func() { _, err := l.ClaimWait(ctx, "k1"); waited <- err }()
		requireHeld(t, hold)
		time.Sleep(ttl - ttl/20) // past the trust window, within the TTL
		hold.Deliver()
		select {
		case <-settled:
		case <-time.After(10 * time.Second):
			t.Fatal("the slow attempt never settled")
		}
		select {
		case <-fail.Failed:
		default:
			t.Fatal("the give-back's release was not sent")
		}
		row, ok := pgtest.ReadRow(t, admin, table, "k1")
		require.True(t, ok && row.Live && row.Holder == l.Holder(), "the slow attempt left a live row of the holder: %+v", row)
		err := l.Close(ctx)
		require.ErrorContains(t, err, `claim "k1" may have written a row that could not be expired again`)
		require.ErrorIs(t, <-waited, pglease.ErrClosed)
	})

	// An Elector's attempt ended on its own timeout with its statement
	// held on the way, and the campaign was pausing before its next wait
	// when Close began: the campaign is in flight, so Close names it.
	t.Run("NamesAnElectorWhoseAttemptTimedOut", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(5*time.Second))
		require.NoError(t, l.CheckTable(ctx))
		el, err := pglease.NewElector(l, "e", pglease.WithTimeout(300*time.Millisecond))
		require.NoError(t, err)
		hold.Arm()
		require.Error(t, el.IsLeader(ctx)) // starts the campaign; its attempt is held
		requireHeld(t, hold)
		require.Eventually(t, func() bool { return pglease.Waiters(l, "e") == 0 }, 10*time.Second, time.Millisecond,
			"the attempt ended, and the campaign pauses")
		requireNamedUnknown(t, l.Close(ctx), "e")
		requireDeliveredLive(t, hold, admin, table, "e", l.Holder(), 0)
	})

	// Guarantee: Close names only what may still be live: the row an
	// attempt left is overwritten by a later attempt of the same Elector,
	// which leads, and Close resigns it, so Close returns nil.
	t.Run("NamesNothingOfARowALaterAttemptOfItsElectorTookAndResigned", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		f := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
		const ttl = 2 * time.Second
		settled := make(chan struct{})
		var once sync.Once
		var slow pgtest.Row // the slow attempt's row, as its failure reported it
		l := pgtest.Locker(t, f, table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(5*time.Second),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventClaimFailed && e.Key == "e" {
					once.Do(func() { slow.Fence = e.Fence; close(settled) })
				}
			}))
		require.NoError(t, l.CheckTable(ctx))
		el, err := pglease.NewElector(l, "e")
		require.NoError(t, err)
		slowAttempt(t, f, ttl, settled, func() {
			go func() { _ = el.IsLeader(ctx) }() // starts the campaign
		})
		require.Positive(t, slow.Fence, "the slow attempt committed its row")

		var lease *pglease.Lease
		require.Eventually(t, func() bool {
			cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
			defer cancel()
			lease, err = el.Campaign(cctx)
			return err == nil
		}, 20*time.Second, 10*time.Millisecond, "the campaign leads in the end")
		require.Greater(t, lease.Fence(), slow.Fence, "the campaign re-claimed the slow attempt's row")

		err = l.Close(ctx)
		row, ok := pgtest.ReadRow(t, admin, table, "e")
		require.True(t, ok && !row.Live, "Close resigned: the row is expired: %+v", row)
		require.NoError(t, err, "Close named a row the campaign re-claimed (fence %d > %d) and resigned: no row of the holder is live", lease.Fence(), slow.Fence)
	})

	// Guarantee: the same for a waiting claim whose later attempt wins the
	// row as Close begins, registers no lease and expires the row itself.
	t.Run("NamesNothingOfARowALaterAttemptOfItsWaitTookAndExpired", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		f := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
		const ttl = 2 * time.Second
		settled, acquired, resume := make(chan struct{}), make(chan struct{}), make(chan struct{})
		var once, onceAcq sync.Once
		var slow pgtest.Row // the slow attempt's row, as its failure reported it
		var fence int64
		l := pgtest.Locker(t, f, table, "a", pglease.WithTTL(ttl), pglease.WithTimeout(5*time.Second),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventClaimFailed && e.Key == "k1" {
					once.Do(func() { slow.Fence = e.Fence; close(settled) })
				}
				if e.Kind == pglease.EventAcquired && e.Key == "k1" {
					onceAcq.Do(func() { fence = e.Fence; close(acquired); <-resume })
				}
			}))
		require.NoError(t, l.CheckTable(ctx))
		waited := make(chan error, 1)
		slowAttempt(t, f, ttl, settled, func() {
			go func() { _, err := l.ClaimWait(ctx, "k1"); waited <- err }()
		})
		require.Positive(t, slow.Fence, "the slow attempt committed its row")
		select {
		case <-acquired:
		case <-time.After(15 * time.Second):
			t.Fatal("the wait never won the key")
		}
		closed := make(chan error, 1)
		go func() { closed <- l.Close(ctx) }()
		requireCloseBegun(t, l)
		close(resume)
		require.ErrorIs(t, <-waited, pglease.ErrClosed)
		err := <-closed
		row, ok := pgtest.ReadRow(t, admin, table, "k1")
		require.Greater(t, fence, slow.Fence)
		require.True(t, ok && !row.Live, "the winning attempt expired its row: %+v", row)
		require.NoError(t, err, "Close named a row a later attempt of the same wait re-claimed (fence %d > %d) and expired", fence, slow.Fence)
	})

	// Two Closes at once, one with a short context: the other names the
	// claim they ended, whether it began first or waited for the first.
	t.Run("NamedByEachCloseThatWaits", func(t *testing.T) {
		t.Parallel()
		ctx, admin, table := pgtest.Setup(t)
		hold := pgtest.NewHoldSend(t, "claim")
		l := pgtest.Locker(t, pgtest.NewFaultyDB(holdPool(t, hold)), table, "a", pglease.WithTTL(time.Minute), pglease.WithTimeout(time.Second))
		hold.Arm()
		claimed := pgtest.ClaimInBackground(ctx, l, "k1")
		requireHeld(t, hold)
		short, cancel := context.WithTimeout(ctx, 5*time.Millisecond)
		defer cancel()
		errs := make(chan error, 1)
		go func() { errs <- l.Close(short) }()
		// Whichever began first, the Close that can wait names it: a later
		// one returns the first's error.
		require.ErrorContains(t, l.Close(ctx), `claim "k1"`)
		require.Error(t, <-errs, "the Close with a short context names the claim, or gave up waiting for the first")
		require.ErrorIs(t, (<-claimed).Err, pglease.ErrClosed)
		requireDeliveredLive(t, hold, admin, table, "k1", l.Holder(), 0)
	})
}

// slowAttempt makes the next claim statement of key through f outlast the
// trust window (ttl) with its give-back's release failing, so that the
// attempt notes a live row it could not expire (the row stays live), and
// returns once that attempt has settled (EventClaimFailed for key: hook
// closes settled); the release statement works again then.
func slowAttempt(t *testing.T, f *pgtest.FaultyDB, ttl time.Duration, settled <-chan struct{}, start func()) {
	t.Helper()
	release := f.Hold("claim")
	f.SetFail("release", errors.New("the release statement failed"))
	start()
	requireEntered(t, f, "claim")
	time.Sleep(ttl - ttl/20) // past the trust window (ttl - ttl/10), within the TTL
	release()
	select {
	case <-settled:
	case <-time.After(15 * time.Second):
		t.Fatal("the slow attempt never settled")
	}
	f.SetFail("release", nil)
}

// requireEntered waits until f holds a statement of kind (FaultyDB.Hold).
func requireEntered(t *testing.T, f *pgtest.FaultyDB, kind string) {
	t.Helper()
	deadline := time.After(15 * time.Second)
	for {
		select {
		case k := <-f.Entered:
			if k == kind {
				return
			}
		case <-deadline:
			t.Fatalf("no %s statement was held", kind)
		}
	}
}

// closeThenDeliver closes l while a claim of it is held on the wire, waits
// for that claim to return (returned), and delivers what hold holds once
// Close has returned: a claim handed to the coalescer returns before its
// give-back, and a statement delivered before Close returns may meet a
// cancel request sent for it.
func closeThenDeliver(ctx context.Context, l *pglease.Locker, hold *pgtest.HoldSend, returned func()) error {
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	returned()
	err := <-closed
	hold.Deliver()
	return err
}

// holdConfig is a connection config whose claim statement is held on its
// way once hold is armed: each statement and its run in one write.
func holdConfig(t *testing.T, hold *pgtest.HoldSend) *pgx.ConnConfig {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	cfg.DefaultQueryExecMode = pgx.QueryExecModeExec
	cfg.DialFunc = hold.Dial(cfg.DialFunc)
	return cfg
}

// requireCloseBegun waits until l's Close has begun: a new Elector is
// refused (making one sends nothing).
func requireCloseBegun(t *testing.T, l *pglease.Locker) {
	t.Helper()
	n := 0
	require.Eventually(t, func() bool {
		n++
		e, err := pglease.NewElector(l, fmt.Sprintf("probe-%d", n))
		if err != nil {
			return strings.Contains(err.Error(), pglease.ErrClosed.Error())
		}
		_ = e.Close(context.Background())
		return false
	}, 10*time.Second, time.Millisecond, "Close has begun")
}

// lockWaiters counts the backends waiting on a lock in a statement that
// names table.
func lockWaiters(t *testing.T, db pglease.DB, table string) int {
	t.Helper()
	var n int
	require.NoError(t, db.QueryRow(context.Background(), `SELECT count(*) FROM pg_stat_activity
		WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&n))
	return n
}

// holdPool is a pool whose claim statement is held on its way once hold
// is armed, through the dial wrappers more (outermost first) too: each
// statement and its run in one write.
func holdPool(t *testing.T, hold *pgtest.HoldSend, more ...func(pgconn.DialFunc) pgconn.DialFunc) *pgxpool.Pool {
	t.Helper()
	return pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
		dial := cfg.ConnConfig.DialFunc
		for i := len(more) - 1; i >= 0; i-- {
			dial = more[i](dial)
		}
		cfg.ConnConfig.DialFunc = hold.Dial(dial)
	})
}

// requireHeld waits until hold holds the claim's statement.
func requireHeld(t *testing.T, hold *pgtest.HoldSend) {
	t.Helper()
	select {
	case <-hold.Held:
	case <-time.After(10 * time.Second):
		t.Fatal("the claim's statement was never written")
	}
}

// requireNamedUnknown requires that err, Close's, names the claim of key
// whose outcome it could not learn.
func requireNamedUnknown(t *testing.T, err error, key string) {
	t.Helper()
	require.ErrorContains(t, err, fmt.Sprintf("claim %q may have written a row that could not be expired again: its claim's outcome is unknown", key))
}

// lateRowOfAClaimGivenUpOn makes a claim of key on l, its statement held by
// early, gives it up, then delivers the statement: the live row it returns
// was written by a claim out of Close's scope, which returned before it.
func lateRowOfAClaimGivenUpOn(ctx context.Context, t *testing.T, l *pglease.Locker, early *pgtest.HoldSend, db pglease.DB, table, key string) pgtest.Row {
	t.Helper()
	early.Arm()
	cctx, cancel := context.WithCancel(ctx)
	abandoned := pgtest.ClaimInBackground(cctx, l, key)
	requireHeld(t, early)
	cancel()
	require.ErrorIs(t, (<-abandoned).Err, context.Canceled)
	return requireDeliveredLive(t, early, db, table, key, l.Holder(), 0)
}

// requireDeliveredLive delivers what hold holds and requires that the
// claim then commits a live row of holder, with a fence above above: the
// row Close named. A row of holder that is not live is not it: a later
// attempt of a campaign may have led, and Close resigned it, before.
func requireDeliveredLive(t *testing.T, hold *pgtest.HoldSend, db pglease.DB, table, key, holder string, above int64) pgtest.Row {
	t.Helper()
	hold.Deliver()
	select {
	case <-hold.Done:
	case <-time.After(10 * time.Second):
		t.Fatal("the held statement was not delivered")
	}
	var row pgtest.Row
	require.Eventually(t, func() bool {
		r, ok := pgtest.ReadRow(t, db, table, key)
		row = r
		return ok && r.Holder == holder && r.Fence > above && r.Live
	}, 5*time.Second, 10*time.Millisecond, "the delivered claim commits a live row, the one Close named: %+v", &row)
	return row
}
