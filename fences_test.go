package pglease

import (
	"fmt"
	"testing"
	"time"
)

func TestKnownFences(t *testing.T) {
	t0 := time.Now()
	t.Run("RemembersTheGreatestFenceUntilItsKeepHasPassed", func(t *testing.T) {
		var k knownFences
		k.see("a", 5, t0, time.Second)
		k.see("a", 3, t0, time.Second) // an older fence never lowers it
		if got := k.greatest("a", t0.Add(999*time.Millisecond)); got != 5 {
			t.Fatalf("greatest = %d, want 5", got)
		}
		if got := k.greatest("a", t0.Add(time.Second)); got != 0 {
			t.Fatalf("greatest after keep = %d, want 0", got)
		}
		if got := k.greatest("b", t0); got != 0 {
			t.Fatalf("greatest of an unknown key = %d, want 0", got)
		}
	})
	t.Run("KeepsTheLaterOfTwoKeeps", func(t *testing.T) {
		var k knownFences
		k.see("a", 1, t0, 10*time.Second)
		k.see("a", 2, t0, time.Second)
		if got := k.greatest("a", t0.Add(5*time.Second)); got != 2 {
			t.Fatalf("greatest = %d, want 2", got)
		}
	})
	t.Run("SweepsExpiredEntriesOnceTheMapHasDoubled", func(t *testing.T) {
		var k knownFences
		for i := range minPrune - 1 {
			k.see(fmt.Sprint("old", i), 1, t0, time.Second)
		}
		k.see("live", 7, t0.Add(2*time.Second), time.Minute)
		if len(k.m) != 1 {
			t.Fatalf("%d entries after the sweep, want 1", len(k.m))
		}
		if got := k.greatest("live", t0.Add(2*time.Second)); got != 7 {
			t.Fatalf("greatest = %d, want 7", got)
		}
	})
}
