package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestGuardCancelRequestNeverReachesALaterClaim: a Guard whose context
// ends in flight, its reply arriving after pgx sent a cancel request (a
// pool that cancels by cancel request), closes the connection under tx:
// given back to the pool the Locker claims on, the late request would
// land on a claim there (with a synchronous standby, cut its wait).
func TestGuardCancelRequestNeverReachesALaterClaim(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name   string
		revoke bool
		warm   bool // the guard statement prepared already: the delayed reply is the guard's own
	}{{"ReplyOK", false, false}, {"ReplyRefused", true, false}, {"PreparedReplyOK", false, true}} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ctx, direct, table := pgtest.Setup(t)
			late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
			pool := pgtest.CancelRequestPool(t, direct.Config().ConnString(), func(cfg *pgxpool.Config) {
				cfg.MaxConns = 3
				cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
				cfg.ConnConfig.DialFunc = late.Dial(cfg.ConnConfig.DialFunc)
				cfg.ConnConfig.Tracer = onStatement{sql: renderSQL(sqlstmt.Guard, table), before: func(c *pgx.Conn) { late.DelayNextReplyOf(c, 600*time.Millisecond) }}
			})
			l := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second), pglease.WithHeartbeatInterval(10*time.Second))
			lease, err := l.Claim(ctx, "guarded")
			require.NoError(t, err)
			freeRow(ctx, t, direct, table, "locked")
			end := pgtest.LockRow(t, direct, table, "locked")
			defer end(false)
			if tc.revoke {
				_, err = adminOf(t, direct, pglease.WithTable(table)).Revoke(ctx, "guarded")
				require.NoError(t, err)
			}

			if tc.warm {
				conn, err := pool.Acquire(ctx)
				require.NoError(t, err)
				// The connection pool.Begin gets next: pgxpool hands the
				// latest back first.
				wtx, err := conn.Begin(ctx)
				require.NoError(t, err)
				require.NoError(t, lease.Guard(ctx, wtx))
				require.NoError(t, wtx.Rollback(ctx))
				conn.Release()
				late.DelayNextReply(0)
			}
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			gctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
			gerr := lease.Guard(gctx, tx)
			cancel()
			t.Logf("Guard: %v", gerr)
			if gerr == nil {
				_ = tx.Commit(context.Background()) // the application's own commit, on a context of its own
			} else {
				require.Error(t, tx.Commit(context.Background()), "a Guard that failed left tx able to commit")
			}
			require.Positive(t, late.Sent(), "pgx sent a cancel request for the guard: the case is the one described")

			claimPastLanded(ctx, t, l, late, end, "locked", "a Guard")
		})
	}
}

// TestGuardRefusalsCancelRequestNeverReachesALaterClaim: the refusal a
// Guard sends after its context ended (sqlstmt.GuardRefused, under the
// Locker's timeout) outlasts that timeout: pgx sends a cancel request, the
// server's refusal comes back, and the connection under tx is closed all
// the same, never given back to the pool the Locker claims on.
func TestGuardRefusalsCancelRequestNeverReachesALaterClaim(t *testing.T) {
	t.Parallel()
	ctx, direct, table := pgtest.Setup(t)
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
	pool := pgtest.CancelRequestPool(t, direct.Config().ConnString(), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 3
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.DialFunc = late.Dial(cfg.ConnConfig.DialFunc)
		cfg.ConnConfig.Tracer = onStatement{sql: sqlstmt.GuardRefused, before: func(c *pgx.Conn) { late.DelayNextReplyOf(c, 900*time.Millisecond) }}
	})
	l := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond),
		pglease.WithTimeout(400*time.Millisecond))
	lease, err := l.Claim(context.WithoutCancel(ctx), "guarded")
	require.NoError(t, err)
	freeRow(ctx, t, direct, table, "locked")
	end := pgtest.LockRow(t, direct, table, "locked")
	defer end(false)
	// The lease is lost: Guard sends no guard statement, only the refusal
	// that makes tx unable to commit, under the Locker's 400 ms.
	_, err = adminOf(t, direct, pglease.WithTable(table)).Revoke(ctx, "guarded")
	require.NoError(t, err)
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the revoked lease was not lost")
	}

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	gerr := lease.Guard(ctx, tx)
	t.Logf("Guard: %v", gerr)
	require.ErrorIs(t, gerr, pglease.ErrLost)
	require.Error(t, tx.Commit(context.Background()), "a Guard that failed left tx able to commit")
	require.Positive(t, late.Sent(), "pgx sent a cancel request for the refusal: the case is the one described")

	claimPastLanded(ctx, t, l, late, end, "locked", "Guard's refusal")
}
