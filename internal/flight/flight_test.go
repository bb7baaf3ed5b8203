package flight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

var errClosed = errors.New("closed")

func TestFlights(t *testing.T) {
	t.Parallel()
	t.Run("CloseEndsTheCallsInFlightWithItsCauseAndRefusesNewOnes", func(t *testing.T) {
		t.Parallel()
		var f Flights
		ctx, call, err := f.Enter(context.Background(), "k")
		if err != nil {
			t.Fatal(err)
		}
		f.Close(errClosed)
		<-ctx.Done()
		if !errors.Is(context.Cause(ctx), errClosed) {
			t.Fatalf("cause = %v, want Close's", context.Cause(ctx))
		}
		if _, _, err := f.Enter(context.Background(), "k"); !errors.Is(err, errClosed) {
			t.Fatalf("Enter after Close: %v, want Close's cause", err)
		}
		short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := f.Wait(short); !errors.Is(err, ErrInFlight) || !errors.Is(err, context.DeadlineExceeded) || !strings.Contains(err.Error(), `"k"`) {
			t.Fatalf("Wait with a call in flight: %v, want ErrInFlight naming it and the context's cause", err)
		}
		call.Leave()
		if err := f.Wait(context.Background()); err != nil {
			t.Fatalf("Wait once it left: %v", err)
		}
	})
	t.Run("WaitReturnsAtOnceWhenNothingIsInFlight", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, call, _ := f.Enter(context.Background(), "k")
		call.Leave()
		f.Close(errClosed)
		if err := f.Wait(context.Background()); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("ACallThatLeavesBeforeCloseKeepsItsOwnCause", func(t *testing.T) {
		t.Parallel()
		var f Flights
		ctx, call, _ := f.Enter(context.Background(), "k")
		call.Leave()
		f.Close(errClosed)
		if errors.Is(context.Cause(ctx), errClosed) {
			t.Fatal("a call that had left was ended by Close")
		}
	})
	t.Run("ASecondCloseKeepsTheFirstCause", func(t *testing.T) {
		t.Parallel()
		var f Flights
		f.Close(errClosed)
		f.Close(errors.New("later"))
		if _, _, err := f.Enter(context.Background(), "k"); !errors.Is(err, errClosed) {
			t.Fatalf("Enter: %v, want the first Close's cause", err)
		}
	})
}

func TestCall(t *testing.T) {
	t.Parallel()
	t.Run("LeavingTwiceCountsOnce", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, a, _ := f.Enter(context.Background(), "a")
		_, b, _ := f.Enter(context.Background(), "b")
		a.Leave()
		a.Leave()
		f.Close(errClosed)
		short, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
		defer cancel()
		if err := f.Wait(short); !errors.Is(err, ErrInFlight) || !strings.Contains(err.Error(), `"b"`) || strings.Contains(err.Error(), `"a"`) {
			t.Fatalf("Wait with b in flight: %v, want ErrInFlight naming b alone", err)
		}
		b.Leave()
		if err := f.Wait(context.Background()); err != nil {
			t.Fatalf("Wait once both left: %v", err)
		}
	})
	t.Run("ClosedBeforeItReturnsOnItsContext", func(t *testing.T) {
		t.Parallel()
		var f Flights
		ctx, c, _ := f.Enter(context.Background(), "k")
		defer c.Leave()
		f.Close(errClosed)
		select {
		case <-ctx.Done():
		default:
			t.Fatal("Close returned before the context of the call in flight ended")
		}
	})
}

func TestNotes(t *testing.T) {
	t.Parallel()
	errA, errB, errC := errors.New("a left something"), errors.New("b left something"), errors.New("c left more")
	t.Run("KeptOnlyOfCallsThatLeaveOnceClosingRan", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, before, _ := f.Enter(context.Background(), "before")
		_, after, _ := f.Enter(context.Background(), "after")
		_, quiet, _ := f.Enter(context.Background(), "quiet")
		before.Note(errA)
		before.Leave() // before Closing: the one who closes never hears of it
		after.Note(errB)
		after.Note(nil)
		after.Note(errC)
		f.Closing()
		if got := f.Notes(); len(got) != 0 {
			t.Fatalf("Notes before any call left since Closing: %v, want none", got)
		}
		after.Leave()
		quiet.Leave()
		after.Note(errA) // after it left: nothing
		got := f.Notes()
		if len(got) != 2 || !errors.Is(got[0], errB) || !errors.Is(got[1], errC) {
			t.Fatalf("Notes = %v, want b's two notes, in order", got)
		}
	})
	t.Run("CloseBeginsClosingToo", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, c, _ := f.Enter(context.Background(), "k")
		c.Note(errA)
		f.Close(errClosed)
		c.Leave()
		if got := f.Notes(); len(got) != 1 || !errors.Is(got[0], errA) {
			t.Fatalf("Notes = %v, want the note of the call Close ended", got)
		}
	})
}

func TestEnterUnder(t *testing.T) {
	t.Parallel()
	errA, errB := errors.New("an attempt left something"), errors.New("another one did")
	t.Run("NotesOfACallThatLeftBeforeClosingGoToItsParent", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, wait, _ := f.Enter(context.Background(), "wait")
		_, attempt, _ := f.EnterUnder(context.Background(), "attempt", wait)
		attempt.Note(errA)
		attempt.Leave()
		f.Closing()
		_, again, _ := f.EnterUnder(context.Background(), "attempt", wait)
		again.Note(errB)
		again.Leave() // since Closing: its own note, kept
		wait.Leave()
		got := f.Notes()
		if len(got) != 2 || !errors.Is(got[0], errB) || !errors.Is(got[1], errA) {
			t.Fatalf("Notes = %v, want the later attempt's, then the first attempt's, which the wait kept", got)
		}
	})
	t.Run("DroppedWithAParentThatLeftBeforeClosing", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, wait, _ := f.Enter(context.Background(), "wait")
		_, attempt, _ := f.EnterUnder(context.Background(), "attempt", wait)
		wait.Leave()
		attempt.Note(errA)
		attempt.Leave()
		f.Closing()
		if got := f.Notes(); len(got) != 0 {
			t.Fatalf("Notes = %v, want none: nothing was in flight as closing began", got)
		}
	})
	t.Run("LeavingLastAfterCloseStillEndsTheWait", func(t *testing.T) {
		t.Parallel()
		var f Flights
		_, wait, _ := f.Enter(context.Background(), "wait")
		_, attempt, _ := f.EnterUnder(context.Background(), "attempt", wait)
		f.Close(errClosed)
		attempt.Leave()
		wait.Leave()
		if err := f.Wait(context.Background()); err != nil {
			t.Fatalf("Wait once both left: %v", err)
		}
	})
}
