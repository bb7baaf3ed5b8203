package pgleaseui

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/pglease/pglease"
)

// view is what the page shows, built from one reading of the table and its
// ledger.
type view struct {
	ServerNow string // the database server's clock at the reading; "" with no row
	Keys      []keyRow
	Holders   []holderRow
	Jobs      []jobRow
	RunsErr   string // why there are no runs to show, if the ledger could not be read
	Since     string // the window of runs shown
	Buttons   bool
	Done      string // what a button just did
	Skews     bool   // the holders show the skew readings of WithClockSkew's Lockers
}

// keyRow is one row of the table.
type keyRow struct {
	Key, Holder, Fence, Left, State, Tick string
	Live                                  bool // Revoke and ForceExpire apply
}

// holderRow is one holder (a replica), with its live leases and its runs
// within the window.
type holderRow struct {
	Holder  string
	Leases  []string
	Runs    int
	LastRun string
	Skew    string // its Locker's clock-skew reading, when this process has it
}

// jobRow is one job with ticks: its recent runs, oldest first, with the
// ticks skipped between them.
type jobRow struct {
	Key     string
	Period  string // the shortest interval between its ticks; "" when unknown
	Entries []entry
	Skipped int // ticks of the period with no run between the first and the last shown
	Doubled int // ticks run again after a run that neither lapsed nor was revoked or given back
	Lapsed  int
	Failed  int // runs whose task returned an error
}

// entry is one run of a job, or a gap of Skipped ticks before the next.
type entry struct {
	Skipped                                            int
	Tick, TickFull, Holder, Fence, Took, Outcome, Note string
	Class                                              string // outcome-<word>, plus doubled or caught-up
}

// stateOf is what became of a row, as `pglease status` says it: revoked
// (Admin.Revoke), released by its holder (a min hold may keep it live a
// while), live, or lapsed (expired without a release: its holder stopped,
// crashed or lost touch with the database).
func stateOf(l pglease.LeaseInfo) string {
	switch {
	case l.Revoked:
		return "revoked"
	case !l.ReleasedAt.IsZero():
		return "released"
	case l.Live:
		return "live"
	}
	return "lapsed"
}

// timeLeft says how long until the row expires, or how long ago it did,
// by the server's clock.
func timeLeft(l pglease.LeaseInfo) string {
	if l.NeverExpires {
		return "never expires"
	}
	d := l.ExpiresAt.Sub(l.ServerNow).Round(100 * time.Millisecond)
	if d > 0 {
		return d.String()
	}
	return "expired " + (-d).String() + " ago"
}

// short writes d without its zero trailing units: 1h, 10m, 1m30s.
func short(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}

func clock(t time.Time) string { return t.UTC().Format("15:04:05") }

// build makes the view of listed rows and runs (sorted by key, then tick,
// as Admin.Runs returns them), keeping the latest perJob runs of each job.
func build(listed []pglease.LeaseInfo, runs []pglease.Run, perJob int) view {
	var v view
	holders := map[string]*holderRow{}
	holder := func(name string) *holderRow {
		h, ok := holders[name]
		if !ok {
			h = &holderRow{Holder: name}
			holders[name] = h
		}
		return h
	}
	for _, l := range listed {
		v.ServerNow = l.ServerNow.UTC().Format("2006-01-02 15:04:05.0Z")
		r := keyRow{Key: l.Key, Holder: l.Holder, Fence: "-", Left: timeLeft(l), State: stateOf(l)}
		r.Live = l.Live && r.State == "live"
		if l.Fence != 0 {
			r.Fence = fmt.Sprint(l.Fence)
		}
		if !l.Tick.IsZero() {
			r.Tick = clock(l.Tick)
		}
		if r.Live {
			h := holder(l.Holder)
			h.Leases = append(h.Leases, l.Key)
		}
		v.Keys = append(v.Keys, r)
	}
	lastRun := map[*holderRow]time.Time{}
	var now time.Time
	if len(listed) > 0 {
		now = listed[0].ServerNow
	}
	for start := 0; start < len(runs); {
		end := start
		for end < len(runs) && runs[end].Key == runs[start].Key {
			end++
		}
		job := runs[start:end]
		for _, r := range job {
			h := holder(r.Holder)
			h.Runs++
			if r.StartedAt.After(lastRun[h]) {
				lastRun[h] = r.StartedAt
				h.LastRun = clock(r.StartedAt)
			}
		}
		if len(job) > perJob {
			job = job[len(job)-perJob:]
		}
		v.Jobs = append(v.Jobs, jobOf(job, now))
		start = end
	}
	for _, h := range holders {
		v.Holders = append(v.Holders, *h)
	}
	sort.Slice(v.Holders, func(i, j int) bool { return v.Holders[i].Holder < v.Holders[j].Holder })
	return v
}

// jobOf lays out the runs of one job, oldest first: the period is the
// shortest interval between two of its ticks, every tick of it with no run
// between two runs, or that the ledger says skipped, is skipped, and a tick run again is caught up when every
// earlier run of it lapsed, was revoked or was given back, and doubled
// otherwise (which the ticks' claims should never let happen).
func jobOf(runs []pglease.Run, now time.Time) jobRow {
	j := jobRow{Key: runs[0].Key}
	var period time.Duration
	for i := 1; i < len(runs); i++ {
		if d := runs[i].Tick.Sub(runs[i-1].Tick); d > 0 && (period == 0 || d < period) {
			period = d
		}
	}
	if period > 0 {
		j.Period = short(period)
	}
	redoable := true // every earlier run of the current tick left it to run again
	var prev pglease.Run
	for i, r := range runs {
		if r.Outcome == "skipped" { // no run: one more tick of the gap before it
			missed := 1
			if i > 0 && period > 0 {
				missed += max(int(r.Tick.Sub(prev.Tick)/period)-1, 0)
			}
			if n := len(j.Entries); n > 0 && j.Entries[n-1].Skipped > 0 {
				j.Entries[n-1].Skipped += missed
			} else {
				j.Entries = append(j.Entries, entry{Skipped: missed})
			}
			j.Skipped += missed
			prev, redoable = r, true
			continue
		}
		e := entry{
			Tick: clock(r.Tick), TickFull: r.Tick.UTC().Format(time.RFC3339Nano),
			Holder: r.Holder, Fence: fmt.Sprint(r.Fence), Outcome: r.Outcome,
			Class: "outcome-" + strings.ReplaceAll(r.Outcome, " ", "-"),
		}
		switch {
		case !r.EndedAt.IsZero():
			e.Took = r.EndedAt.Sub(r.StartedAt).Round(time.Millisecond).String()
		case r.Outcome == "running" && !now.IsZero():
			e.Took = now.Sub(r.StartedAt).Round(100*time.Millisecond).String() + " so far"
		}
		switch r.Outcome {
		case "lapsed":
			j.Lapsed++
		case "failed":
			j.Failed++
		}
		if i > 0 {
			switch {
			case r.Tick.Equal(prev.Tick) && redoable:
				e.Note, e.Class = "caught up", e.Class+" caught-up"
			case r.Tick.Equal(prev.Tick):
				e.Note, e.Class = "doubled", e.Class+" doubled"
				j.Doubled++
			case period > 0:
				if missed := int(r.Tick.Sub(prev.Tick)/period) - 1; missed > 0 {
					j.Entries = append(j.Entries, entry{Skipped: missed})
					j.Skipped += missed
				}
			}
			if !r.Tick.Equal(prev.Tick) {
				redoable = true
			}
		}
		switch r.Outcome {
		case "lapsed", "revoked", "given back":
		default:
			redoable = false
		}
		j.Entries = append(j.Entries, e)
		prev = r
	}
	return j
}

// skewText writes a reading to a tenth of a millisecond: "+" when the
// server is ahead of the replica, "-" when behind, and no sign when the
// offset rounds to zero.
func skewText(s pglease.Skew) string {
	offset := s.Offset.Round(100 * time.Microsecond)
	sign := ""
	if offset > 0 {
		sign = "+"
	}
	return fmt.Sprintf("%s%v ± %v", sign, offset, s.Uncertainty.Round(100*time.Microsecond))
}

// addSkews writes each Locker's clock-skew reading beside its holder,
// adding the holder when it has no lease nor run to show.
func (v *view) addSkews(lockers []*pglease.Locker) {
	for _, l := range lockers {
		v.Skews = true
		reading := "no reading yet"
		if s, ok := l.ClockSkew(); ok {
			reading = skewText(s)
		}
		i := sort.Search(len(v.Holders), func(i int) bool { return v.Holders[i].Holder >= l.Holder() })
		if i == len(v.Holders) || v.Holders[i].Holder != l.Holder() {
			v.Holders = slices.Insert(v.Holders, i, holderRow{Holder: l.Holder()})
		}
		v.Holders[i].Skew = reading
	}
}
