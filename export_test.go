package pglease

import (
	"sync"
	"time"
)

// wallShifts holds, per Locker, how far tests have moved its wall clock.
var wallShifts sync.Map // *Locker -> time.Duration

func init() {
	// Set once, before any test runs: replacing wallOf later would race
	// with the Lockers of parallel tests.
	wallOf = func(l *Locker, t time.Time) time.Time {
		wall := t.Round(0)
		if d, ok := wallShifts.Load(l); ok {
			wall = wall.Add(d.(time.Duration))
		}
		return wall
	}
}

// ShiftWallClock makes l's wall clock read d later than the real one from
// now on (earlier for a negative d), while its monotonic clock runs on
// unchanged: what a Locker sees after its host was suspended for d, or after
// a step of the system clock. Other Lockers are not affected.
func ShiftWallClock(l *Locker, d time.Duration) { wallShifts.Store(l, d) }
