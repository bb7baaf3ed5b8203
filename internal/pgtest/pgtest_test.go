package pgtest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// errorsOf is a testing.TB that keeps what Errorf reports instead of
// failing the test.
type errorsOf struct {
	testing.TB
	errs []string
}

func (e *errorsOf) Errorf(format string, args ...any) {
	e.errs = append(e.errs, fmt.Sprintf(format, args...))
}

// TestClosePool: a pool closes at a test's end; a connection a failed test
// left acquired fails the test, naming how many, instead of hanging it.
func TestClosePool(t *testing.T) {
	t.Parallel()
	ctx := Ctx(t)
	t.Run("NothingAcquired", func(t *testing.T) {
		t.Parallel()
		p, err := pgxpool.New(ctx, Server.DSN())
		require.NoError(t, err)
		require.NoError(t, p.Ping(ctx))
		rec := &errorsOf{TB: t}
		select {
		case <-closePool(rec, p, 5*time.Second):
		default:
			t.Fatal("closePool returned before the pool was closed")
		}
		assert.Empty(t, rec.errs)
	})
	t.Run("ConnectionLeftAcquired", func(t *testing.T) {
		t.Parallel()
		p, err := pgxpool.New(ctx, Server.DSN())
		require.NoError(t, err)
		tx, err := p.Begin(ctx)
		require.NoError(t, err)
		rec := &errorsOf{TB: t}
		closed := closePool(rec, p, 100*time.Millisecond)
		require.Len(t, rec.errs, 1)
		assert.Contains(t, rec.errs[0], "the pool still has 1 connections acquired 100ms after the test ended")
		require.NoError(t, tx.Rollback(context.Background()))
		<-closed
	})
}
