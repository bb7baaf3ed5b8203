package pglease

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestFlights(t *testing.T) {
	t.Run("CloseEndsTheCallsInFlightWithErrClosedAndRefusesNewOnes", func(t *testing.T) {
		var f flights
		ctx, leave, err := f.enter(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		f.close()
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), ErrClosed) {
			t.Fatalf("cause = %v, want ErrClosed", context.Cause(ctx))
		}
		if _, _, err := f.enter(context.Background()); !errors.Is(err, ErrClosed) {
			t.Fatalf("enter after close: %v, want ErrClosed", err)
		}
		short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := f.wait(short); !errors.Is(err, errInFlight) {
			t.Fatalf("wait with a call in flight: %v, want errInFlight", err)
		}
		leave()
		if err := f.wait(context.Background()); err != nil {
			t.Fatalf("wait once it left: %v", err)
		}
	})
	t.Run("WaitReturnsAtOnceWhenNothingIsInFlight", func(t *testing.T) {
		var f flights
		_, leave, _ := f.enter(context.Background())
		leave()
		f.close()
		if err := f.wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ACallThatLeavesBeforeCloseKeepsItsOwnCause", func(t *testing.T) {
		var f flights
		ctx, leave, _ := f.enter(context.Background())
		leave()
		f.close()
		if errors.Is(context.Cause(ctx), ErrClosed) {
			t.Fatal("a call that had left was ended by close")
		}
	})
}
