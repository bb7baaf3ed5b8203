package waiters_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/poll"
	"github.com/pglease/pglease/internal/waiters"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// sleeping starts g.Sleep(ctx, p) and returns its outcome's channel.
func sleeping(ctx context.Context, g *waiters.Group, p waiters.Pause) <-chan error {
	out := make(chan error, 1)
	go func() { out <- g.Sleep(ctx, p) }()
	return out
}

// ended is what a sleep returned, or a failure after a bound no correct
// run comes near.
func ended(t *testing.T, out <-chan error) error {
	t.Helper()
	select {
	case err := <-out:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the sleep did not end")
		return nil
	}
}

func TestSet(t *testing.T) {
	t.Parallel()
	const forever = time.Hour

	t.Run("GroupsWaitersByKey", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		a1, err := s.Join("a")
		require.NoError(t, err)
		a2, err := s.Join("a")
		require.NoError(t, err)
		b, err := s.Join("b")
		require.NoError(t, err)
		require.Same(t, a1, a2, "one group per key")
		require.NotSame(t, a1, b)
		require.Equal(t, 2, s.Waiters("a"))
		s.Leave("a", a1)
		s.Leave("a", a2)
		require.Equal(t, 0, s.Waiters("a"))
		again, err := s.Join("a")
		require.NoError(t, err)
		require.NotSame(t, a1, again, "a key left by all its waiters starts a new group")
		s.Leave("a", again)
		s.Leave("b", b)
	})

	t.Run("OneTurnAtATime", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, err := s.Join("k")
		require.NoError(t, err)
		require.NoError(t, g.Take(context.Background()))
		ctx, cancel := context.WithCancel(context.Background())
		second := make(chan error, 1)
		go func() { second <- g.Take(ctx) }()
		cancel()
		require.ErrorIs(t, ended(t, second), context.Canceled, "the turn is held: only ctx's end returns")
		g.Give()
		require.NoError(t, g.Take(context.Background()), "the turn given back is taken")
		g.Give()
	})

	t.Run("WakeIsKeptUntilFresh", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, err := s.Join("k")
		require.NoError(t, err)
		s.Wake("k")
		require.NoError(t, ended(t, sleeping(context.Background(), g, waiters.Pause{For: forever})), "a wake before the sleep ends it at once")

		s.Wake("k")
		g.Fresh()
		out := sleeping(context.Background(), g, waiters.Pause{For: forever})
		s.Wake("other") // no waiter: nothing
		s.Close()
		require.ErrorIs(t, ended(t, out), waiters.ErrClosed, "Fresh dropped the wake: only Close ended the sleep")
	})

	t.Run("WakesItsOwnKeyOnly", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		a, _ := s.Join("a")
		b, _ := s.Join("b")
		outA := sleeping(context.Background(), a, waiters.Pause{For: forever})
		outB := sleeping(context.Background(), b, waiters.Pause{For: forever})
		s.Wake("a")
		require.NoError(t, ended(t, outA))
		s.Close()
		require.ErrorIs(t, ended(t, outB), waiters.ErrClosed, "b was not woken by a's release")
	})

	t.Run("OwnLeaseAndKickEndASleep", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, _ := s.Join("k")
		own, kick := make(chan struct{}), make(chan struct{}, 1)
		out := sleeping(context.Background(), g, waiters.Pause{For: forever, Own: own, Kick: kick})
		close(own)
		require.NoError(t, ended(t, out))
		waiters.Signal(kick)
		require.NoError(t, ended(t, sleeping(context.Background(), g, waiters.Pause{For: forever, Kick: kick})))
		s.Close()
	})

	t.Run("RepollShortensOnlyAScheduledPause", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, _ := s.Join("k")
		sched := &poll.Schedule{Min: time.Millisecond, Max: time.Second, Notified: forever}
		notified := sched.Pause(true, poll.Live, forever)
		require.Greater(t, notified, time.Minute, "the notified pause is the long safety net")

		out := sleeping(context.Background(), g, waiters.Pause{For: forever})
		s.RepollAll()
		s.Close()
		require.ErrorIs(t, ended(t, out), waiters.ErrClosed, "a pause not the schedule's is not shortened")

		var s2 waiters.Set
		g2, _ := s2.Join("k")
		out = sleeping(context.Background(), g2, waiters.Pause{For: notified, Schedule: sched, Read: time.Now()})
		s2.RepollAll()
		require.NoError(t, ended(t, out), "the notified pause became the polling one")
		s2.Close()
	})

	t.Run("CloseEndsEveryWaitAndRefusesJoins", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, _ := s.Join("k")
		require.NoError(t, g.Take(context.Background()))
		taking := make(chan error, 1)
		go func() { taking <- g.Take(context.Background()) }()
		out := sleeping(context.Background(), g, waiters.Pause{For: forever})
		s.Close()
		s.Close() // idempotent
		require.ErrorIs(t, ended(t, out), waiters.ErrClosed)
		require.ErrorIs(t, ended(t, taking), waiters.ErrClosed)
		_, err := s.Join("k")
		require.ErrorIs(t, err, waiters.ErrClosed, "a Join after Close")
	})

	t.Run("ContextEndsASleep", func(t *testing.T) {
		t.Parallel()
		var s waiters.Set
		g, _ := s.Join("k")
		ctx, cancel := context.WithCancel(context.Background())
		out := sleeping(ctx, g, waiters.Pause{For: forever})
		cancel()
		require.ErrorIs(t, ended(t, out), context.Canceled)
		s.Close()
	})
}
