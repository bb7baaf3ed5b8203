package fence

import (
	"fmt"
	"testing"
	"time"
)

func TestKnown(t *testing.T) {
	t.Parallel()
	t0 := time.Now()
	type seen struct {
		fence int64
		keep  time.Duration
	}
	cases := []struct {
		name string
		seen []seen
		at   time.Duration // after t0
		want int64
	}{
		{"RemembersTheGreatestFence", []seen{{5, time.Second}, {3, time.Second}}, 999 * time.Millisecond, 5},
		{"ForgetsItOnceItsKeepHasPassed", []seen{{5, time.Second}}, time.Second, 0},
		{"KeepsTheLaterOfTwoKeeps", []seen{{1, 10 * time.Second}, {2, time.Second}}, 5 * time.Second, 2},
		{"NothingSeen", nil, 0, 0},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var k Known[string]
			for _, s := range tc.seen {
				k.See("a", s.fence, t0, s.keep)
			}
			if got := k.Greatest("a", t0.Add(tc.at)); got != tc.want {
				t.Fatalf("Greatest = %d, want %d", got, tc.want)
			}
			if got := k.Greatest("b", t0); got != 0 {
				t.Fatalf("Greatest of an unknown key = %d, want 0", got)
			}
		})
	}
	t.Run("SweepsExpiredEntriesOnceTheMapHasDoubled", func(t *testing.T) {
		t.Parallel()
		var k Known[string]
		for i := range MinSweep - 1 {
			k.See(fmt.Sprint("old", i), 1, t0, time.Second)
		}
		if n := k.Len(); n != MinSweep-1 {
			t.Fatalf("%d entries before the sweep, want %d", n, MinSweep-1)
		}
		k.See("live", 7, t0.Add(2*time.Second), time.Minute)
		if n := k.Len(); n != 1 {
			t.Fatalf("%d entries after the sweep, want 1", n)
		}
		if got := k.Greatest("live", t0.Add(2*time.Second)); got != 7 {
			t.Fatalf("Greatest = %d, want 7", got)
		}
	})
}
