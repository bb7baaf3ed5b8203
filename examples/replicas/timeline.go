package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/pglease/pglease"
)

// timeline records the runs of every replica, prints one line per event,
// and counts what the summary reports. Its methods are safe for concurrent
// use: replicas call them from their runs, Lockers from their hooks.
type timeline struct {
	out    io.Writer
	t0     time.Time // tick k is scheduled at t0 + k*period
	period time.Duration
	origin time.Time // elapsed times are counted from here: the first replica's start
	ttl    time.Duration
	width  int // of the replica column

	mu        sync.Mutex
	byTick    map[int64][]*jobRun
	contended map[string][]int64 // by replica: the ticks its claims found the lease held
	killRun   *jobRun            // the run its replica was killed in
	killedAt  time.Time
	takeover  *jobRun // the first run by another replica after the kill
	lost      int
}

// replicaStats is what one replica did over the counted ticks.
type replicaStats struct {
	runs, contended int
}

// jobRun is one run of the job.
type jobRun struct {
	replica string
	fence   int64
	tick    int64
	start   time.Time
	marks   []string
	killed  bool // its line was printed at the kill
}

func newTimeline(out io.Writer, period, ttl time.Duration, names []string) *timeline {
	tl := &timeline{
		out:       out,
		period:    period,
		ttl:       ttl,
		width:     len("replica"),
		byTick:    make(map[int64][]*jobRun),
		contended: make(map[string][]int64),
	}
	for _, n := range names {
		tl.width = max(tl.width, len(n))
	}
	return tl
}

// setBase sets the origin of elapsed times and t0, before any scheduler
// starts.
func (tl *timeline) setBase(origin, t0 time.Time) {
	tl.origin, tl.t0 = origin, t0
}

// tickAt is when tick k is scheduled.
func (tl *timeline) tickAt(k int64) time.Time { return tl.t0.Add(time.Duration(k) * tl.period) }

// tickOf numbers the tick a run belongs to: k = floor((start - t0) / period).
// Every replica's ticks are at t0 + k*period on its own clock (StartOnGrid),
// and its claims reach the database less than one period late (the skew,
// validated), so the runs of one scheduled tick fall in the same k
// whichever replica made them, and two runs in one tick are a double run:
// the same piece of work done twice. With -schedule immediately, the ticks
// of the replicas are out of phase: k is then the period a run fell in.
func (tl *timeline) tickOf(t time.Time) int64 {
	return floorDiv(t.Sub(tl.t0), tl.period)
}

// started prints the line of a replica whose scheduler has just started,
// and the tick of its first run.
func (tl *timeline) started(replica string, at, first time.Time) {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.line(tl.elapsed(at), "", replica, "", "", fmt.Sprintf("STARTED: its first run is due at %s (tick %d)", tl.elapsed(first), tl.tickOf(first)))
}

func (tl *timeline) header() {
	tl.line("elapsed", "tick", "replica", "fence", "run", "")
	tl.line(strings.Repeat("-", 8), strings.Repeat("-", 5), strings.Repeat("-", tl.width), strings.Repeat("-", 6), strings.Repeat("-", 6), "")
}

// line prints one aligned line; the caller holds mu, or is alone.
func (tl *timeline) line(elapsed, tick, replica, fence, took, note string) {
	s := fmt.Sprintf("%8s  %5s  %-*s  %6s  %6s  %s", elapsed, tick, tl.width, replica, fence, took, note)
	fmt.Fprintln(tl.out, strings.TrimRight(s, " "))
}

func (tl *timeline) elapsed(t time.Time) string {
	return fmt.Sprintf("%.3fs", t.Sub(tl.origin).Seconds())
}

// begin records the start of a run, and marks it as a double run, as the
// takeover after a kill, or as the catch-up of the killed run's tick. tick
// is the lease's (Lease.Tick) when the job claims ticks: a catch-up runs
// its tick late. Otherwise it is zero, and the run's tick is the one its
// start falls in.
func (tl *timeline) begin(replica string, fence int64, start, tick time.Time) *jobRun {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	k := tl.tickOf(start)
	if !tick.IsZero() {
		k = tl.tickOf(tick)
	}
	rn := &jobRun{replica: replica, fence: fence, tick: k, start: start}
	others := tl.finished(k)
	caughtUp := tl.killRun != nil && k == tl.killRun.tick && len(others) == 0
	if len(others) > 0 {
		o := others[0]
		rn.marks = append(rn.marks, fmt.Sprintf("DOUBLE RUN: tick %d already ran on %s (fence %d)", rn.tick, o.replica, o.fence))
	}
	if tl.killRun != nil && tl.takeover == nil && replica != tl.killRun.replica {
		tl.takeover = rn
		what := "TAKEOVER"
		if caughtUp {
			what = fmt.Sprintf("CAUGHT UP tick %d", k)
		}
		rn.marks = append(rn.marks, fmt.Sprintf("%s from %s: fence %d -> %d, %s after the kill",
			what, tl.killRun.replica, tl.killRun.fence, fence, start.Sub(tl.killedAt).Round(10*time.Millisecond)))
	}
	tl.byTick[rn.tick] = append(tl.byTick[rn.tick], rn)
	return rn
}

// finished returns the runs of tick k but the killed one, which was cut
// short: a second of them is the tick's work done twice. The caller holds
// mu.
func (tl *timeline) finished(k int64) []*jobRun {
	var runs []*jobRun
	for _, rn := range tl.byTick[k] {
		if rn != tl.killRun {
			runs = append(runs, rn)
		}
	}
	return runs
}

// end prints the line of a run that has returned err, unless the run's
// replica was killed during it.
func (tl *timeline) end(rn *jobRun, err error) {
	took := time.Since(rn.start).Round(time.Millisecond)
	marks := rn.marks
	switch {
	case err == nil:
	case errors.Is(err, pglease.ErrLost):
		marks = append(marks, "aborted: its lease was lost")
	case errors.Is(err, context.Canceled):
		marks = append(marks, "aborted: its scheduler shut down")
	default:
		marks = append(marks, "aborted: "+err.Error())
	}
	tl.mu.Lock()
	defer tl.mu.Unlock()
	if rn.killed {
		return
	}
	tl.line(tl.elapsed(rn.start), fmt.Sprint(rn.tick), rn.replica, fmt.Sprint(rn.fence), took.String(), strings.Join(marks, "; "))
}

// killed prints the line of rn, in the middle of which its replica is
// being killed; the run column shows how long it had run.
func (tl *timeline) killed(rn *jobRun) {
	now := time.Now()
	tl.mu.Lock()
	defer tl.mu.Unlock()
	tl.killRun, tl.killedAt = rn, now
	rn.killed = true
	marks := append(append([]string(nil), rn.marks...), "KILLED mid-run: database access cut, scheduler shut down, lease not released")
	tl.line(tl.elapsed(rn.start), fmt.Sprint(rn.tick), rn.replica, fmt.Sprint(rn.fence),
		now.Sub(rn.start).Round(time.Millisecond).String(), strings.Join(marks, "; "))
}

// event is every Locker's hook. Contention is normal between replicas: it
// is only counted. A lease that ends without a release gets a line.
func (tl *timeline) event(e pglease.Event) {
	// A Locker's holder is its replica's name, '#' and a random suffix.
	replica, _, _ := strings.Cut(e.Holder, "#")
	tl.mu.Lock()
	defer tl.mu.Unlock()
	switch e.Kind {
	case pglease.EventContended:
		tl.contended[replica] = append(tl.contended[replica], tl.tickOf(time.Now()))
	case pglease.EventLost, pglease.EventReleaseFailed:
		tl.lost++
		why := e.Err.Error()
		if errors.Is(e.Err, errKilled) {
			why = fmt.Sprintf("Unlock could not reach the database; the row stays held until its TTL (%v) runs out", tl.ttl)
		}
		now := time.Now()
		tl.line(tl.elapsed(now), fmt.Sprint(tl.tickOf(now)), replica, fmt.Sprint(e.Fence), "", "LEASE LOST: "+why)
	}
}

// summary is what the demo observed over its complete ticks.
type summary struct {
	firstTick, ticks int64
	runs             int
	uncounted        int     // runs in ticks cut short by the stop
	doubles          int     // ticks that ran more than once
	extraRuns        int     // runs beyond the first in those ticks
	missedFailover   []int64 // ticks with no run, after the kill and before the takeover
	missedOther      []int64
	ticksMode        bool // the job claims ticks, with catch-up
	caughtUp         int  // runs of the killed run's tick by other replicas
	catchUpDue       bool // the demo ran long enough after the kill for its catch-up
	ledger           ledger
	takeover         *jobRun
	killRun          *jobRun
	lost             int
	stats            map[string]replicaStats
	promised         bool          // the conditions of exactly once held
	medianGap        time.Duration // between the starts of consecutive runs
}

// failed reports a tick that ran twice, or was missed other than while
// failing over, where the conditions of exactly once held: what README
// promises, so the demo doubles as a check.
//
// With ticks, the guarantee is README's: each tick completed at most once,
// in the ledger too; every tick run but those skipped while the killed
// run held the key; and the killed run's tick caught up exactly once.
func (s summary) failed() bool {
	if !s.promised {
		return false
	}
	if s.ticksMode && (s.ledger.err != nil || s.ledger.completedTwice() > 0 || s.lostCatchUp()) {
		return true
	}
	return s.doubles > 0 || len(s.missedOther) > 0
}

// lostCatchUp reports a killed run whose tick was not run again exactly
// once, though the demo ran long enough for it.
func (s summary) lostCatchUp() bool {
	if s.killRun == nil || !s.catchUpDue {
		return false
	}
	lapsed, after := s.ledger.caughtUp(s.killRun.tick)
	return s.caughtUp != 1 || s.ledger.err != nil || !lapsed || after != 1
}

// summarize counts ticks firstTick .. firstTick+ticks-1: the ticks every
// started replica's claim had been sent for before the schedulers were
// shut down.
// ticksMode says whether the job claims ticks with catch-up, and
// stoppedAt is when the schedulers were stopped.
func (tl *timeline) summarize(firstTick, ticks int64, promised, ticksMode bool, stoppedAt time.Time) summary {
	tl.mu.Lock()
	defer tl.mu.Unlock()
	s := summary{
		firstTick: firstTick,
		ticks:     ticks,
		takeover:  tl.takeover,
		killRun:   tl.killRun,
		lost:      tl.lost,
		stats:     make(map[string]replicaStats),
		promised:  promised,
		ticksMode: ticksMode,
	}
	if tl.killRun != nil {
		s.caughtUp = len(tl.finished(tl.killRun.tick))
		// The catch-up waits for the lapse, at most one TTL after the kill,
		// for at most the TTL and the period.
		s.catchUpDue = ticksMode && stoppedAt.Sub(tl.killedAt) >= tl.ttl+tl.period
	}
	counted := func(k int64) bool { return k >= firstTick && k < firstTick+ticks }
	for k, runs := range tl.byTick {
		if !counted(k) {
			s.uncounted += len(runs)
			continue
		}
		for _, rn := range runs {
			st := s.stats[rn.replica]
			st.runs++
			s.stats[rn.replica] = st
		}
	}
	for name, ticks := range tl.contended {
		st := s.stats[name]
		for _, k := range ticks {
			if counted(k) {
				st.contended++
			}
		}
		s.stats[name] = st
	}
	var starts []time.Time
	for k := firstTick; k < firstTick+ticks; k++ {
		for _, rn := range tl.byTick[k] {
			starts = append(starts, rn.start)
		}
	}
	s.medianGap = medianGap(starts)
	for k := firstTick; k < firstTick+ticks; k++ {
		s.runs += len(tl.byTick[k])
		n := len(tl.finished(k))
		killed := tl.killRun != nil && k == tl.killRun.tick
		switch {
		case n > 1:
			s.doubles++
			s.extraRuns += n - 1
		case n == 0 && killed:
			// The killed run's own tick: caught up, or counted by
			// lostCatchUp.
		case n == 0 && tl.failingOver(k):
			s.missedFailover = append(s.missedFailover, k)
		case n == 0:
			s.missedOther = append(s.missedOther, k)
		}
	}
	return s
}

// failingOver reports whether tick k came after the killed run's and
// before the takeover started: while the killed replica's lease was still
// running out, holding the key.
func (tl *timeline) failingOver(k int64) bool {
	return tl.killRun != nil && k > tl.killRun.tick && (tl.takeover == nil || tl.tickAt(k).Before(tl.takeover.start))
}

// print writes the summary table for the replicas of this process.
func (s summary) print(w io.Writer, cfg config, reps []*replica) {
	hold := cfg.minHold.String()
	if cfg.minHold == 0 {
		hold = "off"
	}
	schedule := "ticks with catch-up"
	if !cfg.ticks {
		schedule = "schedule " + cfg.schedule
	}
	fmt.Fprintf(w, "\nsummary: %d ticks of %v, %s, %s, min hold %s, TTL %v, clocks up to %v apart\n",
		s.ticks, cfg.period, plural(len(reps), "replica"), schedule, hold, cfg.ttl, cfg.skew)

	width := len("replica")
	for _, r := range reps {
		width = max(width, len(r.name))
	}
	fmt.Fprintf(w, "  %-*s  %8s  %9s  %5s  %9s  %s\n", width, "replica", "started", "clock", "runs", "contended", "state")
	for _, r := range reps {
		st := s.stats[r.name]
		state := "alive"
		if s.killRun != nil && s.killRun.replica == r.name {
			state = fmt.Sprintf("killed in tick %d", s.killRun.tick)
		}
		fmt.Fprintf(w, "  %-*s  %8s  %9s  %5d  %9d  %s\n", width, r.name, startString(r.startAt), lagString(r.lag), st.runs, st.contended, state)
	}
	fmt.Fprintln(w)

	row := func(label string, n int, note string) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %-26s %5d  %s", label, n, note), " "))
	}
	if cfg.replica != "" {
		row("ticks", int(s.ticks), fmt.Sprintf("ticks %d..%d of the hour's grid", s.firstTick, s.firstTick+s.ticks-1))
		row("runs here", s.runs, "the other runs were made by replicas in other processes")
		row("leases lost", s.lost, "")
		if cfg.ticks {
			s.ledger.print(w, width)
		}
		return
	}
	ticksNote := ""
	if s.uncounted > 0 {
		ticksNote = fmt.Sprintf("not counted: %s before tick 0 or in the tick cut short by the stop", plural(s.uncounted, "run"))
	}
	row("ticks", int(s.ticks), ticksNote)
	runsNote := ""
	if s.medianGap > 0 {
		runsNote = fmt.Sprintf("one every %v (the median between two runs), for one every %v", s.medianGap.Round(10*time.Millisecond), cfg.period)
	}
	row("runs", s.runs, runsNote)
	doubleNote := "two runs in one tick"
	if s.doubles > 0 {
		doubleNote = fmt.Sprintf("%d extra runs", s.extraRuns)
		switch {
		case cfg.schedule == immediately:
			doubleNote += ": each replica's ticks are in the phase of its start, and the min hold merges only claims within it of each other"
		case cfg.minHold == 0:
			doubleNote += ": with min hold off, a replica whose clock is slower runs the tick again (gocron issue 841)"
		case cfg.minHold <= cfg.skew+latency:
			doubleNote += ": a replica whose claim comes more than the min hold after the first finds the key free and runs the tick again"
		}
	}
	row("double runs", s.doubles, doubleNote)
	failoverNote := ""
	if len(s.missedFailover) > 0 {
		failoverNote = fmt.Sprintf("%s: the killed run held the key until its lease lapsed (TTL %v)", tickRange(s.missedFailover), cfg.ttl)
	}
	row("skipped while failing over", len(s.missedFailover), failoverNote)
	row("missed otherwise", len(s.missedOther), tickRange(s.missedOther))
	if cfg.ticks {
		caughtUpNote := ""
		switch {
		case s.killRun == nil:
		case s.caughtUp > 0 && s.takeover != nil:
			caughtUpNote = fmt.Sprintf("tick %d, killed on %s (fence %d), run again on %s with fence %d",
				s.killRun.tick, s.killRun.replica, s.killRun.fence, s.takeover.replica, s.takeover.fence)
		case !s.catchUpDue:
			caughtUpNote = "none before the end: run longer than the TTL and a period after the kill"
		default:
			caughtUpNote = fmt.Sprintf("tick %d, killed on %s, was not run again", s.killRun.tick, s.killRun.replica)
		}
		row("caught up", s.caughtUp, caughtUpNote)
	} else {
		takeovers, takeoverNote := 0, ""
		if s.takeover != nil {
			takeovers = 1
			takeoverNote = fmt.Sprintf("%s in tick %d with fence %d > %d", s.takeover.replica, s.takeover.tick, s.takeover.fence, s.killRun.fence)
		} else if s.killRun != nil {
			takeoverNote = "none before the end: run longer than the TTL after the kill"
		}
		row("takeovers", takeovers, takeoverNote)
	}
	row("leases lost", s.lost, "")
	if cfg.ticks {
		s.ledger.print(w, width)
	}
	fmt.Fprintln(w)
	switch {
	case s.failed() && cfg.ticks && s.ledger.err != nil:
		fmt.Fprintln(w, "FAIL: the ledger of runs could not be read")
	case s.failed() && cfg.ticks:
		fmt.Fprintf(w, "FAIL: %d ticks ran twice (%d completed twice in the ledger), %d were missed, and the killed run's tick was caught up %d times, for once\n",
			s.doubles, s.ledger.completedTwice(), len(s.missedOther), s.caughtUp)
	case s.failed():
		fmt.Fprintf(w, "FAIL: %d ticks ran twice and %d were missed although the conditions of exactly once held\n", s.doubles, len(s.missedOther))
	case s.doubles > 0 || len(s.missedOther) > 0:
		fmt.Fprintln(w, "as expected where the conditions of exactly once do not hold, not every tick ran once; run again without -schedule, -min-hold or -skew to see each tick run once")
	case cfg.ticks && s.killRun != nil && s.caughtUp == 1:
		fmt.Fprintf(w, "ok: no tick completed twice; every tick ran but those skipped while the killed run held the key; the killed run's tick %d was caught up once, with a greater fence\n", s.killRun.tick)
	case cfg.ticks && s.killRun != nil:
		fmt.Fprintln(w, "ok: no tick completed twice; every tick ran but those skipped while the killed run held the key; the demo ended before its tick was due to be caught up")
	case cfg.ticks:
		fmt.Fprintln(w, "ok: no tick completed twice, and every tick ran")
	default:
		fmt.Fprintf(w, "ok: each tick ran exactly once, with replicas started at random moments and clocks up to %v apart\n", cfg.skew)
	}
}

// medianGap is the median time between consecutive starts, or 0 for
// fewer than two.
func medianGap(starts []time.Time) time.Duration {
	if len(starts) < 2 {
		return 0
	}
	slices.SortFunc(starts, time.Time.Compare)
	gaps := make([]time.Duration, len(starts)-1)
	for i := range gaps {
		gaps[i] = starts[i+1].Sub(starts[i])
	}
	slices.Sort(gaps)
	return gaps[len(gaps)/2]
}

func plural(n int, noun string) string {
	if n == 1 {
		return "1 " + noun
	}
	return fmt.Sprintf("%d %ss", n, noun)
}

// startString writes a start moment after the first: "+1.372s".
func startString(d time.Duration) string {
	return fmt.Sprintf("+%.3fs", d.Seconds())
}

// lagString writes how slow a replica's clock is: "150ms slow", "on time".
func lagString(d time.Duration) string {
	if d == 0 {
		return "on time"
	}
	return fmt.Sprintf("%dms slow", d.Milliseconds())
}

// tickRange writes ticks compactly: "tick 7", "ticks 7-9", "ticks 3, 7-9".
func tickRange(ticks []int64) string {
	if len(ticks) == 0 {
		return ""
	}
	var parts []string
	for i := 0; i < len(ticks); {
		j := i
		for j+1 < len(ticks) && ticks[j+1] == ticks[j]+1 {
			j++
		}
		if i == j {
			parts = append(parts, fmt.Sprint(ticks[i]))
		} else {
			parts = append(parts, fmt.Sprintf("%d-%d", ticks[i], ticks[j]))
		}
		i = j + 1
	}
	if len(ticks) == 1 {
		return "tick " + parts[0]
	}
	return "ticks " + strings.Join(parts, ", ")
}
