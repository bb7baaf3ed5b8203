package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
)

// runRow is one run as runs -json prints it.
type runRow struct {
	Key       string      `json:"key"`
	Tick      serverTime  `json:"tick"`
	Fence     int64       `json:"fence"`
	Holder    string      `json:"holder"`
	StartedAt serverTime  `json:"started_at"`
	EndedAt   *serverTime `json:"ended_at"` // null while it runs, or when unknown
	Outcome   string      `json:"outcome"`
}

var runsCommand = command{
	name: "runs",
	summary: "Lists the runs of jobs with ticks (WithPeriod) from the ledger beside the table,\n" +
		"sorted by job and tick: the tick, the fence and holder that ran it, when it started\n" +
		"and ended, and how: running, completed, failed (its task returned an error),\n" +
		"lapsed (expired without a release: its\n" +
		"holder was killed or cut off, and the run may not have finished), revoked,\n" +
		"superseded, unknown, or skipped (no run: an earlier tick's run still held the key).\n" +
		"-json prints a JSON array of objects with key, tick, fence,\n" +
		"holder, started_at, ended_at (null while it runs) and outcome.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.BoolVar(&c.jsonOut, "json", false, "print JSON instead of a table")
		fs.StringVar(&c.job, "job", "", "only the runs of this job (its key)")
		fs.DurationVar(&c.since, "since", 24*time.Hour, "only the runs started within this long")
	},
	check: func(c *cli) error {
		if c.since <= 0 {
			return fmt.Errorf("-since %v: must be positive", c.since)
		}
		return nil
	},
	do: func(ctx context.Context, c *cli) error {
		var runs []pglease.Run
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			admin, err := c.admin(conn)
			if err != nil {
				return err
			}
			runs, err = admin.Runs(ctx, c.job, c.since)
			return err
		})
		if err != nil {
			return err
		}
		rows := make([]runRow, 0, len(runs)) // [] rather than null in JSON
		for _, r := range runs {
			row := runRow{Key: r.Key, Tick: serverTime{Time: r.Tick}, Fence: r.Fence, Holder: r.Holder,
				StartedAt: serverTime{Time: r.StartedAt}, Outcome: r.Outcome}
			if !r.EndedAt.IsZero() {
				row.EndedAt = &serverTime{Time: r.EndedAt}
			}
			rows = append(rows, row)
		}
		if c.jsonOut {
			enc := json.NewEncoder(c.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rows)
		}
		w := tabwriter.NewWriter(c.stdout, 0, 8, 2, ' ', 0)
		fmt.Fprintln(w, "JOB\tTICK\tFENCE\tHOLDER\tSTARTED\tTOOK\tOUTCOME")
		for _, r := range rows {
			took := "-"
			if r.EndedAt != nil {
				took = r.EndedAt.Sub(r.StartedAt.Time).Round(time.Millisecond).String()
			}
			fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", r.Key, r.Tick.UTC().Format(timeFormat), r.Fence, r.Holder,
				r.StartedAt.UTC().Format(timeFormat), took, r.Outcome)
		}
		return w.Flush()
	},
}
