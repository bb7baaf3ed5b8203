package trust

import (
	"sync/atomic"
	"testing"
	"time"
)

func TestDeadline(t *testing.T) {
	t.Parallel()
	const d = 10 * time.Second
	cases := []struct {
		name    string
		elapsed time.Duration // on the monotonic clock since the send
		shift   time.Duration // of the wall clock since the send
		left    time.Duration
	}{
		{"HoldsOnBothClocks", 4 * time.Second, 0, 6 * time.Second},
		{"PassedOnTheMonotonicClock", 11 * time.Second, 0, -time.Second},
		{"WallClockSteppedForwardEndsItEarly", time.Second, 5 * time.Second, 4 * time.Second},
		{"SuspendPassedItOnTheWallClock", time.Second, time.Minute, -51 * time.Second},
		{"WallClockSteppedBackLeavesTheMonotonicDeadline", 4 * time.Second, -time.Hour, 6 * time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var c Clock
			sent := time.Now()
			dl := c.Deadline(sent, d)
			c.Shift(tc.shift)
			if got := dl.Left(sent.Add(tc.elapsed)); got != tc.left {
				t.Fatalf("Left %v, want %v", got, tc.left)
			}
		})
	}
	t.Run("ZeroHasPassed", func(t *testing.T) {
		t.Parallel()
		if left := (Deadline{}).Left(time.Now()); left > 0 {
			t.Fatalf("the zero Deadline holds for %v", left)
		}
	})
	t.Run("WallStripsTheMonotonicReading", func(t *testing.T) {
		t.Parallel()
		var c Clock
		now := time.Now()
		if w := c.Wall(now); w != now.Round(0) {
			t.Fatalf("Wall %v, want %v", w, now.Round(0))
		}
		c.Shift(time.Hour)
		if w := c.Wall(now); !w.Equal(now.Add(time.Hour)) {
			t.Fatalf("shifted Wall %v, want an hour later than %v", w, now)
		}
	})
}

// wakes counts a Watchdog's Checks and signals each.
type wakes struct {
	n    atomic.Int32
	each chan struct{}
}

func (w *wakes) check() {
	w.n.Add(1)
	select {
	case w.each <- struct{}{}:
	default:
	}
}

func (w *wakes) wait(t *testing.T) {
	t.Helper()
	select {
	case <-w.each:
	case <-time.After(5 * time.Second):
		t.Fatal("the watchdog never woke")
	}
}

func TestWatchdog(t *testing.T) {
	t.Parallel()
	slice := func() time.Duration { return time.Millisecond }

	t.Run("WakesWhileKeepHolds", func(t *testing.T) {
		t.Parallel()
		var keep atomic.Int32
		keep.Store(3)
		w := &wakes{each: make(chan struct{}, 10)}
		wd := &Watchdog{Slice: slice, Check: w.check, Keep: func() bool { return keep.Add(-1) > 0 }}
		defer wd.Stop()
		wd.Start()
		for range 3 {
			w.wait(t)
		}
		time.Sleep(20 * time.Millisecond)
		if n := w.n.Load(); n != 3 {
			t.Fatalf("%d wakes, want 3: it went on once Keep said no", n)
		}
		keep.Store(1)
		wd.Start() // armed again
		w.wait(t)
	})

	t.Run("NeverWakesOnceStopped", func(t *testing.T) {
		t.Parallel()
		w := &wakes{each: make(chan struct{}, 10)}
		wd := &Watchdog{Slice: slice, Check: w.check, Keep: func() bool { return true }}
		wd.Start()
		w.wait(t)
		wd.Stop()
		n := w.n.Load()
		wd.Start()
		time.Sleep(20 * time.Millisecond)
		// A wake already running as Stop returned may finish its Check,
		// and does not sleep again.
		if got := w.n.Load(); got > n+1 {
			t.Fatalf("%d wakes after Stop", got-n)
		}
	})

	t.Run("CutShortensTheSleepInProgress", func(t *testing.T) {
		t.Parallel()
		var long atomic.Bool
		long.Store(true)
		w := &wakes{each: make(chan struct{}, 10)}
		wd := &Watchdog{
			Slice: func() time.Duration {
				if long.Load() {
					return time.Hour
				}
				return time.Millisecond
			},
			Check: w.check, Keep: func() bool { return false },
		}
		defer wd.Stop()
		wd.Start()
		long.Store(false)
		wd.Cut()
		w.wait(t)
	})

	t.Run("CutDoesNotArm", func(t *testing.T) {
		t.Parallel()
		w := &wakes{each: make(chan struct{}, 10)}
		wd := &Watchdog{Slice: slice, Check: w.check, Keep: func() bool { return true }}
		defer wd.Stop()
		wd.Cut()
		time.Sleep(20 * time.Millisecond)
		if n := w.n.Load(); n != 0 {
			t.Fatalf("%d wakes of a watchdog never started", n)
		}
	})
}
