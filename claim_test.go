package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// requireNoLiveRowOf fails unless every key's row is absent, expired, or
// carries another holder than holder, within limit (a give-back may run just
// after its caller returned).
func requireNoLiveRowOf(t *testing.T, pool pglease.DB, table, holder string, limit time.Duration, keys ...string) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for {
		var live []pgtest.Row
		for _, key := range keys {
			if row, ok := pgtest.ReadRow(t, pool, table, key); ok && row.Live && row.Holder == holder {
				live = append(live, row)
			}
		}
		if len(live) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d row(s) of %q still live %v after their claims failed, held by nobody: %+v", len(live), holder, limit, live)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestClaim pins what a claim leaves on the server: a commit that waits
// for the WAL flush only when it takes a row, and, when the claim fails,
// times out or is abandoned in flight, nothing live that nobody holds.
func TestClaim(t *testing.T) {
	t.Parallel()
	// Guarantee: a claim sent alone whose reply is held until its caller gives
	// up gives its row back before it returns.
	t.Run("CancelledInFlightGivesItsRowBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

		cctx, cancel := context.WithCancel(ctx)
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		go func() {
			<-claim.Hit
			cancel()
		}()
		_, err := l.Claim(cctx, "job")
		require.Error(t, err)
		require.ErrorIs(t, err, context.Canceled)
		requireNoLiveRowOf(t, pool, table, "a", 0, "job")
	})

	// Guarantee: a claim whose context ends while its statement is in flight
	// gives back what that statement committed, also when the claim was queued
	// in a burst and every caller of the burst gave up.
	t.Run("AbandonedBurstGivesItsRowsBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		wire := pgtest.NewWire(t, pool)
		l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

		keys := []string{"k1", "k2"}
		cctx, cancel := context.WithCancel(ctx)
		claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
		send := pglease.PrepareClaimBurst([]context.Context{cctx, cctx}, l, keys)
		out := make(chan []error, 1)
		go func() {
			_, errs := send()
			out <- errs
		}()
		<-claim.Hit
		cancel()
		errs := <-out
		for i, err := range errs {
			require.ErrorIs(t, err, context.Canceled, "claim of %q", keys[i])
		}
		<-claim.Ran
		// The key turn is handed to the orphan's give-back: a second claim of
		// the key by another holder tells whether the key is free.
		requireNoLiveRowOf(t, pool, table, "a", 3*time.Second, keys...)
		b := pgtest.Locker(t, pool, table, "b")
		for _, key := range keys {
			_, err := b.Claim(ctx, key)
			require.NoError(t, err, "the key %q stays locked by a row nobody holds", key)
		}
	})

	// Guarantee: Lock "claims key within the Locker's timeout", and a claim that
	// fails hands out nothing. A claim waits on the row lock of a guarded
	// transaction; Lock's timeout cancels it on the client, but pgx only drops
	// the connection: the server keeps the statement waiting on the lock, and
	// once the guarded transaction ends it takes the key for a holder that was
	// told it failed. Nobody holds the Lease, nobody heartbeats or releases it,
	// and every replica is refused the key for the claimer's whole TTL.
	t.Run("TimedOutOnAGuardedRowTakesNothingLater", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTimeout(300*time.Millisecond)) // TTL 60s
		c := pgtest.Locker(t, pool, table, "c")

		lease, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		tx := guardedTx(t, pool, lease)

		_, err = b.Lock(ctx, "job")
		require.Error(t, err)
		t.Logf("b's Lock: %v", err)
		var waiting int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, 'ON CONFLICT') > 0`).Scan(&waiting))
		t.Logf("claims still waiting on the server after Lock returned: %d", waiting)
		require.Eventually(t, func() bool { r, _ := pgtest.ReadRow(t, pool, table, "job"); return !r.Live }, 5*time.Second, 10*time.Millisecond,
			"a's row lapses while guarded")
		require.NoError(t, tx.Commit(ctx)) // the guarded writes land; the key is free

		// Give a cancelled statement every chance to land.
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			r, _ := pgtest.ReadRow(t, pool, table, "job")
			if r.Holder == "b" {
				break
			}
			time.Sleep(10 * time.Millisecond) // polling the row, bounded above
		}
		r, _ := pgtest.ReadRow(t, pool, table, "job")
		t.Logf("row after the guarded commit: %+v", r)
		_, held := b.Held("job")
		assert.False(t, held)
		_, err = c.Claim(ctx, "job")
		assert.NoError(t, err, "the key is nobody's lease, yet a claim is refused")
	})

	// Guarantee: never two holders trusting a lease of one key at once, on a
	// pool of one connection whose claims wait on a locked row while the
	// heartbeat needs the connection.
	t.Run("PoolOfOneNeverTrustsTwoHolders", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) { c.MaxConns = 1 })
		other := pgtest.Pool(t, nil)
		table := pgtest.Table(t, other)
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second))
		b := pgtest.Locker(t, other, table, "b", pglease.WithTTL(2*time.Second))

		held, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = a.Claim(ctx, "locked")
		require.NoError(t, err)
		blocker := pgtest.LockRows(t, other, table, "key = $1", "locked")
		claimed := make(chan error, 1)
		go func() {
			cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
			defer cancel()
			_, err := a.Claim(cctx, "locked")
			claimed <- err
		}()
		deadline := time.Now().Add(5 * time.Second)
		for time.Now().Before(deadline) {
			trusted := held.Err() == nil
			ls, err := b.Claim(ctx, "job")
			if err == nil {
				require.False(t, trusted, "b claimed job (fence %d) while a still trusted fence %d", ls.Fence(), held.Fence())
				stillTrusted := held.Err() == nil
				require.False(t, stillTrusted, "a trusts job after b claimed it")
				break
			}
			require.ErrorIs(t, err, pglease.ErrHeld)
			time.Sleep(20 * time.Millisecond)
		}
		require.NoError(t, blocker.Rollback(ctx))
		err = <-claimed
		t.Logf("re-entrant claim of the locked row: %v; job lease: %v", err, held.Err())
	})

	// WaitsForTheWALFlushOnlyWhenItTakesARow reads the synchronous_commit a
	// claim statement leaves for its commit: the session's setting, raised to
	// on from off or local, when the claim takes a row (its acknowledgement
	// must survive a crash, and a stronger setting is the operator's), and off
	// when it takes none (a claim that only read, or locked a row it then lost,
	// has nothing worth a flush). Each form of the claim: alone, in a burst,
	// and without a fence column.
	t.Run("WaitsForTheWALFlushOnlyWhenItTakesARow", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tbl := pgx.Identifier{table}
		holder := pgtest.Locker(t, pool, table, "holder")
		_, err := holder.Claim(ctx, "held")
		require.NoError(t, err)

		forms := map[string]func(key string) (string, []any){
			"Claim": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.Claim, tbl), []any{key, "claimer", 60.0}
			},
			"ClaimAll": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.ClaimAll, tbl), []any{"claimer", []float64{60}, []string{key}, "500ms"}
			},
			"UnfencedClaim": func(key string) (string, []any) {
				return sqlstmt.Render(sqlstmt.UnfencedClaimFor(true), tbl), []any{key, "claimer#0123456789abcdef", 60.0, "claimer#"}
			},
		}
		n := 0
		for name, form := range forms {
			for _, c := range []struct{ session, taken, lost string }{
				{"on", "on", "off"},
				{"off", "on", "off"},
				{"local", "on", "off"},
				{"remote_write", "remote_write", "off"},
				{"remote_apply", "remote_apply", "off"},
			} {
				for _, take := range []bool{true, false} {
					key, want := "held", c.lost
					if take {
						n++
						key, want = fmt.Sprintf("free-%d", n), c.taken
					}
					tx, err := pool.Begin(ctx)
					require.NoError(t, err)
					_, err = tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", c.session)
					require.NoError(t, err)
					sql, args := form(key)
					rows, err := tx.Query(ctx, sql, args...)
					require.NoError(t, err)
					got := 0
					for rows.Next() {
						got++
					}
					require.NoError(t, rows.Err())
					var setting string
					require.NoError(t, tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&setting))
					require.NoError(t, tx.Rollback(ctx))
					if take {
						require.Equal(t, 1, got, "%s of a free key took no row", name)
					} else {
						require.Zero(t, got, "%s of a held key took a row", name)
					}
					require.Equal(t, want, setting, "%s with the session at %s, taking a row: %v", name, c.session, take)
				}
			}
		}
	})
}
