package pglease_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// claimUntilLanded claims key with l under a context that ends 2 s after
// late's cancel request landed (10 s at most).
func claimUntilLanded(ctx context.Context, t *testing.T, l *pglease.Locker, late *pgtest.LateCancel, key string) (*pglease.Lease, error) {
	t.Helper()
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watched := late.AfterLanded(cctx, 2*time.Second, cancel)
	got, err := l.Claim(cctx, key)
	cancel()
	<-watched
	return got, err
}

// claimPastLanded claims key with l under a context that never ends, its
// row lock (end) held until late's cancel request landed and half a second
// more, and requires that the claim got the lease: the late cancel request
// of what (a statement given up earlier) never reached it.
func claimPastLanded(ctx context.Context, t *testing.T, l *pglease.Locker, late *pgtest.LateCancel, end func(bool), key, what string) {
	t.Helper()
	landed := late.AfterLanded(ctx, 500*time.Millisecond, func() { end(false) })
	got, err := l.Claim(context.WithoutCancel(ctx), key)
	<-landed
	require.Positive(t, late.Landed(), "the late cancel request was delivered while the claim waited: the case is the one described")
	require.NoError(t, err, "a claim whose context never ended was cancelled by the late cancel request of %s", what)
	require.NoError(t, got.Unlock(ctx))
}

// TestAdminCancelRequestOnAGivenConnection: an Admin (or Migrate) given a
// single *pgx.Conn that cancels by cancel request, whose statement's
// context ends in flight, closes that connection: left open with the
// request on its way, a Locker's claim there, whose commit waits for a
// synchronous standby that never answers, would be reported done.
//
// It and TestAdminCancelRequestOnAPoolConnection run before the package's
// parallel tests, not beside them: each case starts a private server, and
// beside the other tests their starts made tests bound by time fail. Their
// cases run beside each other, as nothing else runs then.
func TestAdminCancelRequestOnAGivenConnection(t *testing.T) { //nolint:tparallel // before the parallel tests, on purpose (above)
	for _, op := range []string{"Control", "Purge", "List", "Runs", "Migrate"} {
		t.Run(op, func(t *testing.T) {
			t.Parallel() // beside each other, before any other test of the package: see below
			ctx, srv, pool, table := pgtest.PrivateSetup(t)
			cfg, late := pgtest.LateCancelConfig(t, pool.Config().ConnString(), 2500*time.Millisecond)
			cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
				return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
			}
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			adm := adminOf(t, conn, pglease.WithTable(table))
			pgtest.AbsentStandby(ctx, t, srv.DSN())

			late.DelayNextReply(500 * time.Millisecond)
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			switch op {
			case "Purge":
				_, err = adm.Purge(actx, time.Hour)
			case "List":
				_, err = adm.List(actx)
			case "Runs":
				_, err = adm.Runs(actx, "job", time.Hour)
			case "Migrate":
				err = pglease.Migrate(actx, conn, pglease.WithTable(table))
			case "Control": // no statement given up: the claim must fail at its context's end
				late.DelayNextReply(0)
				cancel()
				l := pgtest.Locker(t, conn, table, "holder")
				cctx, cancel := context.WithTimeout(ctx, 4*time.Second)
				defer cancel()
				got, err := l.Claim(cctx, "free")
				t.Logf("control claim: %v", err)
				require.Error(t, err, "the claim's commit waits for the absent standby")
				require.Nil(t, got)
				return
			}
			cancel()
			t.Logf("%s: %v", op, err)
			require.Positive(t, late.Sent(), "pgx sent a cancel request: the case is the one described")
			require.True(t, conn.IsClosed(), "%s left its connection open with a cancel request on its way", op)
		})
	}
}

// TestAdminCancelRequestOnAPoolConnection: an Admin given one connection
// acquired from the pool (*pgxpool.Conn) or a transaction on it (pgx.Tx),
// its statement given up in flight, closes that connection: given back to
// the pool the Locker claims on, the late cancel request would cut a
// claim's commit's wait for a synchronous standby, and the claim would be
// reported done.
func TestAdminCancelRequestOnAPoolConnection(t *testing.T) { //nolint:tparallel // as TestAdminCancelRequestOnAGivenConnection
	for _, kind := range []string{"PoolConn", "Tx"} {
		t.Run(kind, func(t *testing.T) {
			t.Parallel() // as above
			ctx, srv, pool, table := pgtest.PrivateSetup(t)
			late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
			cpool, _ := late.Pool(t, pool.Config().ConnString(), 2)
			l := pgtest.Locker(t, cpool, table, "holder", pglease.WithTTL(time.Minute))
			warm, err := l.Claim(ctx, "warm")
			require.NoError(t, err)
			require.NoError(t, warm.Unlock(ctx))
			pgtest.AbsentStandby(ctx, t, srv.DSN())

			pc, err := cpool.Acquire(ctx)
			require.NoError(t, err)
			var db pglease.DB = pc
			if kind == "Tx" {
				tx, err := pc.Begin(ctx)
				require.NoError(t, err)
				defer func() { _ = tx.Rollback(context.Background()) }()
				db = tx
			}
			adm := adminOf(t, db, pglease.WithTable(table))
			late.DelayNextReply(500 * time.Millisecond)
			actx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = adm.List(actx)
			cancel()
			t.Logf("List: %v (closed: %v)", err, pc.Conn().IsClosed())
			require.Positive(t, late.Sent(), "pgx sent a cancel request: the case is the one described")
			if kind == "Tx" {
				_ = db.(interface{ Rollback(context.Context) error }).Rollback(context.Background())
			}
			pc.Release()

			got, err := claimUntilLanded(ctx, t, l, late, "free")
			require.Eventually(t, func() bool { return late.Landed() > 0 }, 10*time.Second, 50*time.Millisecond,
				"the late cancel request was delivered: the case is the one described")
			require.Error(t, err, "a lease was handed out whose commit's wait for the standby the late cancel request of Admin's List cut")
			require.Nil(t, got)
		})
	}
}
