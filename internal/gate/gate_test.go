package gate

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// entered runs enter on a goroutine of its own and reports its outcome.
func entered(ctx context.Context, enter func(context.Context) error) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- enter(ctx) }()
	return ch
}

func requireIn(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		if err != nil {
			t.Fatalf("not let in: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("never let in")
	}
}

func requireWaiting(t *testing.T, ch <-chan error) {
	t.Helper()
	select {
	case err := <-ch:
		t.Fatalf("let in (%v) while it should wait", err)
	case <-time.After(20 * time.Millisecond):
	}
}

func TestGate(t *testing.T) {
	t.Parallel()

	t.Run("WhoWaitsForWhom", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			name      string
			in        string // "round" or "release": what is in first
			next      string
			nextWaits bool
		}{
			{"ReleasesRunTogether", "release", "release", false},
			{"ARoundWaitsForARelease", "release", "round", true},
			{"AReleaseWaitsForARound", "round", "release", true},
			{"ARoundWaitsForARound", "round", "round", true},
		}
		for _, tc := range cases {
			t.Run(tc.name, func(t *testing.T) {
				t.Parallel()
				var g Gate
				enter := map[string]func(context.Context) error{"round": g.EnterRound, "release": g.EnterRelease}
				leave := map[string]func(){"round": g.LeaveRound, "release": g.LeaveRelease}
				requireIn(t, entered(context.Background(), enter[tc.in]))
				next := entered(context.Background(), enter[tc.next])
				if tc.nextWaits {
					requireWaiting(t, next)
					leave[tc.in]()
					requireIn(t, next)
				} else {
					requireIn(t, next)
					leave[tc.in]()
				}
				leave[tc.next]()
			})
		}
	})

	t.Run("AWaitingRoundGoesBeforeNewReleases", func(t *testing.T) {
		t.Parallel()
		var g Gate
		requireIn(t, entered(context.Background(), g.EnterRelease))
		round := entered(context.Background(), g.EnterRound)
		requireWaiting(t, round)
		late := entered(context.Background(), g.EnterRelease)
		requireWaiting(t, late)
		g.LeaveRelease()
		requireIn(t, round)
		requireWaiting(t, late)
		g.LeaveRound()
		requireIn(t, late)
		g.LeaveRelease()
	})

	t.Run("AWaiterWhoseContextEndsIsNotLetIn", func(t *testing.T) {
		t.Parallel()
		for _, first := range []string{"round", "release"} {
			var g Gate
			if first == "round" {
				requireIn(t, entered(context.Background(), g.EnterRound))
			} else {
				requireIn(t, entered(context.Background(), g.EnterRelease))
			}
			cause := errors.New("gave up")
			ctx, cancel := context.WithCancelCause(context.Background())
			w := entered(ctx, g.EnterRound)
			requireWaiting(t, w)
			cancel(cause)
			if err := <-w; !errors.Is(err, cause) {
				t.Fatalf("after a %s: the waiter got %v, want its context's cause", first, err)
			}
			if first == "round" {
				g.LeaveRound()
			} else {
				g.LeaveRelease()
			}
			// The round that gave up no longer holds releases back.
			requireIn(t, entered(context.Background(), g.EnterRelease))
			g.LeaveRelease()
		}
	})

	t.Run("ARoundNeverOverlapsAnything", func(t *testing.T) {
		t.Parallel()
		var (
			g                Gate
			rounds, releases atomic.Int32
			bad              atomic.Bool
			wg               sync.WaitGroup
		)
		for i := range 40 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if i%4 == 0 {
					if g.EnterRound(context.Background()) != nil {
						return
					}
					if rounds.Add(1) > 1 || releases.Load() > 0 {
						bad.Store(true)
					}
					time.Sleep(50 * time.Microsecond)
					rounds.Add(-1)
					g.LeaveRound()
					return
				}
				if g.EnterRelease(context.Background()) != nil {
					return
				}
				releases.Add(1)
				if rounds.Load() > 0 {
					bad.Store(true)
				}
				time.Sleep(50 * time.Microsecond)
				releases.Add(-1)
				g.LeaveRelease()
			}()
		}
		wg.Wait()
		if bad.Load() {
			t.Fatal("a round ran alongside another round or a release")
		}
	})
}
