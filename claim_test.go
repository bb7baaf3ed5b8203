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

// Guarantee: Close holds nothing and has nothing in flight when it returns,
// even when the claims it ends were queued in a burst whose statement had
// already left: the statement commits, its reply never reaches a caller.
func TestCloseDuringABurstInFlightLeavesNoLiveRow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	wire := pgtest.NewWire(t, pool)
	l := pgtest.Locker(t, wire, table, "a", pglease.WithTTL(30*time.Second), pglease.WithTimeout(5*time.Second))

	keys := []string{"k1", "k2"}
	claim := wire.Arm(pgtest.Kind("claim"), pgtest.DelayReply)
	send := pglease.PrepareClaimBurst([]context.Context{ctx, ctx}, l, keys)
	out := make(chan []error, 1)
	go func() {
		_, errs := send()
		out <- errs
	}()
	<-claim.Hit

	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	select {
	case err := <-closed:
		t.Logf("Close: %v", err)
	case <-time.After(15 * time.Second):
		t.Fatal("Close did not return within 15s")
	}
	errs := <-out
	for i, err := range errs {
		require.Error(t, err, "claim of %q", keys[i])
		t.Logf("claim of %q: %v", keys[i], err)
	}
	requireNoLiveRowOf(t, pool, table, "a", 0, keys...)
}

// Guarantee: a claim whose context ends while its statement is in flight
// gives back what that statement committed, also when the claim was queued
// in a burst and every caller of the burst gave up.
func TestBurstWhoseCallersAllGiveUpInFlightGivesItsRowsBack(t *testing.T) {
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
}

// Guarantee: a claim sent alone whose reply is held until its caller gives
// up gives its row back before it returns.
func TestClaimAloneCancelledInFlightGivesItsRowBack(t *testing.T) {
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
}

// TestClaimWaitsForTheWALFlushOnlyWhenItTakesARow reads the
// synchronous_commit a claim statement leaves for its commit: the
// session's setting, raised to on from off or local, when the claim takes a
// row (its acknowledgement must survive a crash, and a stronger setting is
// the operator's), and off when it takes none (a claim that only read, or
// locked a row it then lost, has nothing worth a flush). Each form of the
// claim: alone, in a burst, and without a fence column.
func TestClaimWaitsForTheWALFlushOnlyWhenItTakesARow(t *testing.T) {
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
}
