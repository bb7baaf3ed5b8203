package pglease

import (
	"testing"
	"time"
)

// TestTableCheck is the state of a Locker's check of its table, without
// a database: a check that passed stands for its interval, then a claim
// checks again; one that failed stands for nothing.
func TestTableCheck(t *testing.T) {
	t.Run("StandsForItsInterval", func(t *testing.T) {
		c := tableCheck{every: 50 * time.Millisecond}
		if c.fresh() {
			t.Fatal("fresh before any check passed")
		}
		passed := time.Now()
		c.passed.Store(&passed)
		if !c.fresh() {
			t.Fatal("not fresh just after a check passed")
		}
		time.Sleep(60 * time.Millisecond)
		if c.fresh() {
			t.Fatal("fresh past its interval")
		}
		c.passed.Store(&passed)
		c.every = 0
		if c.fresh() {
			t.Fatal("fresh with an interval of 0: every claim checks")
		}
		c.every = time.Hour
		c.passed.Store(nil) // a check that failed
		if c.fresh() {
			t.Fatal("fresh after a check that failed")
		}
	})
}
