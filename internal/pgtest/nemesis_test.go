package pgtest_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.ShortRun("^(TestStallWatch|TestLateCancelAfterLanded)$"))
}

func TestNemesisDBLosesTheReplyOfAStatementThatRan(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	nem := pgtest.NewNemesisDB(t, pool, 1)
	l := pgtest.Locker(t, nem, table, "a")

	nem.LoseReplies("claim", 1)
	_, err := l.Claim(ctx, "k")
	require.ErrorIs(t, err, pgtest.ErrReplyLost)
	row, ok := pgtest.ReadRow(t, pool, table, "k")
	require.True(t, ok, "the claim ran")
	assert.Equal(t, l.Holder(), row.Holder)
	assert.False(t, row.Live, "the Locker gave back the row of the claim whose reply it never saw")
	assert.Equal(t, map[string]int{"lost claim": 1}, nem.Counts())

	nem.Heal()
	lease, err := l.Claim(ctx, "k")
	require.NoError(t, err)
	assert.Greater(t, lease.Fence(), row.Fence)
}

func TestNemesisDBSendsAStatementAfterItsSenderGaveUp(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	nem := pgtest.NewNemesisDB(t, pool, 1)
	l := pgtest.Locker(t, nem, table, "a")

	nem.DeliverLate("claim", 1, 200*time.Millisecond, 2*time.Second)
	began := time.Now()
	_, err := l.Claim(ctx, "k")
	require.ErrorIs(t, err, context.DeadlineExceeded, "the caller gives up at once")
	assert.Less(t, time.Since(began), time.Second)
	nem.Heal()
	require.NoError(t, nem.Drain(ctx))
	row, ok := pgtest.ReadRow(t, pool, table, "k")
	require.True(t, ok, "the claim ran once its delay was over")
	assert.Equal(t, l.Holder(), row.Holder)
	assert.Equal(t, map[string]int{"late claim": 1}, nem.Counts())
}

func TestNemesisDBHoldsStatementsBeforeTheyAreSentAndFailsThemUnsentWhenTheContextEnds(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	nem := pgtest.NewNemesisDB(t, pool, 1)
	l := pgtest.Locker(t, nem, table, "a")

	nem.Slow(time.Second)
	cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	_, err := l.Claim(cctx, "k")
	cancel()
	require.Error(t, err)
	_, ok := pgtest.ReadRow(t, pool, table, "k")
	assert.False(t, ok, "a statement held past its context is never sent")

	nem.Slow(100 * time.Millisecond)
	began := time.Now()
	_, err = l.Claim(ctx, "k")
	require.NoError(t, err)
	assert.GreaterOrEqual(t, time.Since(began), 100*time.Millisecond)
}

func TestHoldConnectionsTakesEveryConnectionOfThePool(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a")
	hctx, cancel := context.WithTimeout(ctx, time.Second)
	release, held := pgtest.HoldConnections(hctx, pool)
	cancel()
	assert.Equal(t, int(pool.Config().MaxConns), held)
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	_, err := l.Claim(cctx, "k")
	cancel()
	require.Error(t, err, "a claim finds no connection")
	release()
	_, err = l.Claim(ctx, "k")
	require.NoError(t, err)
}

func TestWaitQuietWaitsForAnOpenTransactionToEnd(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	app := pgtest.Name("quiet")
	busy := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) { cfg.ConnConfig.RuntimeParams["application_name"] = app })
	admin := pgtest.Pool(t, nil)
	require.NoError(t, pgtest.WaitQuiet(ctx, admin, app))

	tx, err := busy.Begin(ctx)
	require.NoError(t, err)
	_, err = tx.Exec(ctx, `SELECT 1`)
	require.NoError(t, err)
	wctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	err = pgtest.WaitQuiet(wctx, admin, app)
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded, "a transaction open")
	require.NoError(t, tx.Rollback(ctx))
	require.NoError(t, pgtest.WaitQuiet(ctx, admin, app))
}

var _ pglease.DB = (*pgtest.NemesisDB)(nil)
