package pgtest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

func TestLateCancelAfterLanded(t *testing.T) {
	t.Parallel()
	t.Run("WaitsForALandedRequestThenItsWait", func(t *testing.T) {
		t.Parallel()
		l := &LateCancel{}
		var calledAt time.Time
		done := l.AfterLanded(t.Context(), 50*time.Millisecond, func() { calledAt = time.Now() })
		time.Sleep(100 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("then was called before any request landed")
		default:
		}
		landedAt := time.Now()
		l.landed.Add(1)
		<-done
		assert.GreaterOrEqual(t, calledAt.Sub(landedAt), 50*time.Millisecond, "then waited its wait after the request landed")
	})
	t.Run("EndsWithItsContext", func(t *testing.T) {
		t.Parallel()
		l := &LateCancel{}
		ctx, cancel := context.WithCancel(t.Context())
		called := false
		done := l.AfterLanded(ctx, time.Hour, func() { called = true })
		cancel()
		<-done
		assert.True(t, called, "then is called when the context ends, with no request landed")
	})
	t.Run("EndsItsWaitWithItsContext", func(t *testing.T) {
		t.Parallel()
		l := &LateCancel{}
		l.landed.Add(1)
		ctx, cancel := context.WithCancel(t.Context())
		called := false
		done := l.AfterLanded(ctx, time.Hour, func() { called = true })
		time.Sleep(30 * time.Millisecond)
		cancel()
		<-done
		assert.True(t, called, "then is called when the context ends during its wait")
	})
}
