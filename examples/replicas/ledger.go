package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
)

// ledger is what the ledger of runs (pglease.Admin.Runs) recorded of the
// demo's job: each run's tick, replica, fence and outcome, as the
// database saw them, whatever the replicas printed.
type ledger struct {
	runs []ledgerRun
	err  error // the ledger could not be read
}

// ledgerRun is one run in the ledger, its tick numbered as the timeline's.
type ledgerRun struct {
	pglease.Run
	tick    int64
	replica string // the holder, without the Locker's random suffix
}

// readLedger reads the runs of the job started within since, and keeps
// those of the holders given (the Lockers of this process), or all of
// them when holders is nil (-replica: the other processes' runs too).
func readLedger(ctx context.Context, dsn, table string, since time.Duration, holders map[string]bool, tl *timeline) ledger {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return ledger{err: fmt.Errorf("connect: %w", err)}
	}
	defer conn.Close(context.WithoutCancel(ctx))
	admin, err := pglease.NewAdmin(conn, pglease.WithTable(table))
	if err != nil {
		return ledger{err: err}
	}
	runs, err := admin.Runs(ctx, jobName, since)
	if err != nil {
		return ledger{err: err}
	}
	var l ledger
	for _, r := range runs {
		if holders != nil && !holders[r.Holder] {
			continue // an earlier demo's, on the same table
		}
		replica, _, _ := strings.Cut(r.Holder, "#")
		l.runs = append(l.runs, ledgerRun{Run: r, tick: tl.tickOf(r.Tick), replica: replica})
	}
	return l
}

// completedTwice counts the ticks the ledger shows completed more than
// once.
func (l ledger) completedTwice() int {
	n := 0
	completed := map[int64]int{}
	for _, r := range l.runs {
		if r.Outcome == "completed" {
			completed[r.tick]++
			if completed[r.tick] == 2 {
				n++
			}
		}
	}
	return n
}

// caughtUp reports whether the ledger shows the run of tick k lapsed, and
// how many runs of k came after the first lapsed one, with greater fences.
func (l ledger) caughtUp(k int64) (lapsed bool, after int) {
	for _, r := range l.runs {
		switch {
		case r.tick != k:
		case lapsed:
			after++
		case r.Outcome == "lapsed":
			lapsed = true
		}
	}
	return lapsed, after
}

// print writes the ledger as a table, in tick order, and marks the runs
// of a tick run more than once: a lapsed run and its catch-up.
func (l ledger) print(w io.Writer, width int) {
	fmt.Fprintf(w, "\nledger of runs of %q (pglease.Admin.Runs; the command line: pglease runs -job %s):\n", jobName, jobName)
	if l.err != nil {
		fmt.Fprintf(w, "  not read: %v\n", l.err)
		return
	}
	line := func(tick, replica, fence, outcome, note string) {
		fmt.Fprintln(w, strings.TrimRight(fmt.Sprintf("  %5s  %-*s  %6s  %-10s  %s", tick, width, replica, fence, outcome, note), " "))
	}
	line("tick", "replica", "fence", "outcome", "")
	line(strings.Repeat("-", 5), strings.Repeat("-", width), strings.Repeat("-", 6), strings.Repeat("-", 10), "")
	for i, r := range l.runs {
		note := ""
		switch {
		case i > 0 && l.runs[i-1].tick == r.tick:
			p := l.runs[i-1]
			note = fmt.Sprintf("the same tick again, fence %d > %d", r.Fence, p.Fence)
			if p.Outcome == "lapsed" {
				note = fmt.Sprintf("CAUGHT UP: lapsed on %s, run again on %s with fence %d > %d", p.replica, r.replica, r.Fence, p.Fence)
			}
		case r.Outcome == "lapsed":
			note = "its replica was killed mid-run: expired without a release"
		case r.Outcome == "skipped":
			note = "no run: the run of an earlier tick still held the key"
		}
		line(fmt.Sprint(r.tick), r.replica, fmt.Sprint(r.Fence), r.Outcome, note)
	}
}
