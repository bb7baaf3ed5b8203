package fakedriver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

func TestFailNext(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	lost := errors.New("connection reset")

	t.Run("BeforeItRanNothingIsWritten", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		a.FailNext(Claim, driver.NotSentError(lost), false)
		_, ok, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.ErrorIs(t, err, lost)
		assert.False(t, ok)
		assert.Equal(t, driver.NotSent, driver.OutcomeOf(err))
		_, exists := tbl.Row("k")
		assert.False(t, exists)

		c, ok, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err, "a fault fails one statement")
		assert.True(t, ok)
		assert.Equal(t, int64(1), c.Fence)
	})
	t.Run("AfterItRanItsWritesStand", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		a.FailNext(ReleaseOne, lost, true)
		got, err := a.ReleaseOne(ctx, nil, leaseOf("k", c))
		require.ErrorIs(t, err, lost)
		assert.Nil(t, got)
		assert.Equal(t, driver.Unknown, driver.OutcomeOf(err))
		r, _ := tbl.Row("k")
		assert.False(t, r.Live, "released, though its reply was lost")
	})
	t.Run("FaultsQueueByKindAndByHolder", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a, b := tbl.Protocol("a"), tbl.Protocol("b")
		first, second := errors.New("first"), errors.New("second")
		a.FailNext(ReadRow, first, false)
		a.FailNext(ReadRow, second, false)
		_, err := b.ReadRow(ctx, nil, "k", time.Second)
		require.NoError(t, err, "another holder's statement")
		_, _, err = a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err, "another kind")
		_, err = a.ReadRow(ctx, nil, "k", time.Second)
		require.ErrorIs(t, err, first)
		_, err = a.ReadRow(ctx, nil, "k", time.Second)
		require.ErrorIs(t, err, second)
		_, err = a.ReadRow(ctx, nil, "k", time.Second)
		require.NoError(t, err)
	})
	t.Run("ASerializationFailureIsSentAgain", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		a := tbl.Protocol("a")
		c, _, err := a.Claim(ctx, nil, "k", time.Minute, 0)
		require.NoError(t, err)
		serial := &pgconn.PgError{Code: driver.SerializationFailure}
		a.FailNext(Extend, serial, false)
		got, err := a.Extend(ctx, nil, []driver.Lease{leaseOf("k", c)})
		require.NoError(t, err)
		assert.Contains(t, got, 0)

		a.FailNext(ReadRow, serial, false)
		_, err = a.ReadRow(ctx, nil, "k", time.Second)
		assert.True(t, driver.Is(err, driver.SerializationFailure), "a read is not sent again: %v", err)
	})
	t.Run("AStatementWhoseContextEndedIsNotSent", func(t *testing.T) {
		t.Parallel()
		tbl := NewTable()
		ended, cancel := context.WithCancel(ctx)
		cancel()
		_, _, err := tbl.Protocol("a").Claim(ended, nil, "k", time.Minute, 0)
		require.ErrorIs(t, err, context.Canceled)
		assert.Equal(t, driver.NotSent, driver.OutcomeOf(err))
		_, exists := tbl.Row("k")
		assert.False(t, exists)
	})
}
