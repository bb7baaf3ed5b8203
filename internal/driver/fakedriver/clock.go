package fakedriver

import "time"

// Start is what the clock of a new Table reads: a fixed instant, so that
// the ticks a test expects can be computed from it.
var Start = time.Date(2026, time.January, 2, 3, 4, 5, 678901000, time.UTC)

// Clock is the server's clock of a Table, the only clock its statements
// read. It moves when a test moves it, and by a microsecond after each
// statement (step): on a server no two statements read the same instant,
// and a frozen clock would keep a lease released at the very instant of
// its claim live (a release keeps a row a microsecond past its acquired
// time, for the CHECK). *Table is one.
type Clock interface {
	Now() time.Time
	Advance(d time.Duration)
}

var _ Clock = (*Table)(nil)

// Now is the server's clock, in whole microseconds as clock_timestamp()
// reads it.
func (t *Table) Now() time.Time {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.clock()
}

// Advance moves the clock by d; a negative d moves it back, as a server's
// clock stepped back by its time service.
func (t *Table) Advance(d time.Duration) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.now = t.now.Add(d)
}

// step moves the clock by a microsecond, after a statement, with t.mu
// held.
func (t *Table) step() { t.now = t.now.Add(time.Microsecond) }

// clock is Now with t.mu held.
func (t *Table) clock() time.Time { return t.now.Truncate(time.Microsecond) }

// interval is d as make_interval(secs => d.Seconds()) makes it: rounded to
// the microsecond.
func interval(d time.Duration) time.Duration { return d.Round(time.Microsecond) }
