package pglease_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestLocker pins the Locker's own surface: what its constructors accept.
func TestLocker(t *testing.T) {
	t.Parallel()
	// A Locker's statements must each commit on their own: on a pgx.Tx (which
	// satisfies DB), a claim would live or die with the caller's transaction,
	// and a rollback would let another holder in while the Locker trusts the
	// lease; a release would turn synchronous_commit off for the rest of the
	// caller's transaction. NewLocker and NewElector refuse one, naming it.
	t.Run("RefusesATransaction", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()

		const want = "pglease: new locker: db is a pgx.Tx: a Locker needs a pool or a connection, each statement committing on its own"
		_, err = pglease.New(tx)
		require.EqualError(t, err, want)
		require.PanicsWithError(t, want, func() { pglease.NewLocker(tx) })
	})
}
