package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
)

// statusRow is one key as status -json prints it.
type statusRow struct {
	Key              string      `json:"key"`
	Holder           string      `json:"holder"`
	Fence            *int64      `json:"fence"`              // null on a table without fence column
	AcquiredAt       *serverTime `json:"acquired_at"`        // null on a table without acquired_at
	ExpiresAt        serverTime  `json:"expires_at"`         // "infinity" for a row that never expires
	ExpiresInSeconds *float64    `json:"expires_in_seconds"` // negative once expired; null for a row that never expires
	Live             bool        `json:"live"`
	State            string      `json:"state"`       // live, released, lapsed or revoked
	ReleasedAt       *serverTime `json:"released_at"` // null unless its holder released it
	Tick             *serverTime `json:"tick"`        // null unless claimed for a job's tick
}

// stateOf is what became of a row: live, revoked (Revoke, `pglease
// release`), released by its holder, or lapsed (expired without a release:
// its holder stopped, crashed, or lost touch with the database).
func stateOf(l pglease.LeaseInfo) string {
	switch {
	case l.Revoked:
		return "revoked"
	case !l.ReleasedAt.IsZero():
		return "released" // a min hold may keep it live a while: nobody claims it sooner
	case l.Live:
		return "live"
	}
	return "lapsed"
}

// serverTime is a time of a row in JSON: RFC 3339, or "infinity" (as
// PostgreSQL writes it) for the expiry of a row that never expires. Unlike
// time.Time's, its encoding never fails, whatever the year (a row may
// expire after 9999).
type serverTime struct {
	time.Time
	infinite bool
}

func (t serverTime) MarshalJSON() ([]byte, error) {
	if t.infinite {
		return []byte(`"infinity"`), nil
	}
	return json.Marshal(t.Format(time.RFC3339Nano))
}

func (t *serverTime) UnmarshalJSON(b []byte) error {
	if string(b) == `"infinity"` {
		*t = serverTime{infinite: true}
		return nil
	}
	return t.Time.UnmarshalJSON(b)
}

var statusCommand = command{
	name: "status",
	summary: "Lists every key of the table, sorted: its holder, its current fence, when it was\n" +
		"acquired, how long until it expires (negative: expired that long ago; never, for a\n" +
		"row whose expires_at is infinity) and its state, all by the database's clock: live,\n" +
		"released (by its holder), lapsed (expired without a release: its holder stopped or\n" +
		"crashed) or revoked. -json prints a JSON array of objects with key, holder, fence,\n" +
		"acquired_at, expires_at (\"infinity\" for a row that never expires),\n" +
		"expires_in_seconds (null then), live, state, released_at and tick (null when none).",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.BoolVar(&c.jsonOut, "json", false, "print JSON instead of a table")
	},
	do: func(ctx context.Context, c *cli) error {
		var listed []pglease.LeaseInfo
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			admin, err := c.admin(conn)
			if err != nil {
				return err
			}
			listed, err = admin.List(ctx)
			return err
		})
		if err != nil {
			return err
		}
		rows := statusRows(listed)
		if c.jsonOut {
			enc := json.NewEncoder(c.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rows)
		}
		return printStatus(c, rows)
	},
}

// statusRows turns what Admin.List read into what status prints: fence
// and acquired_at null where the table has no such column.
func statusRows(listed []pglease.LeaseInfo) []statusRow {
	out := make([]statusRow, 0, len(listed)) // [] rather than null in JSON
	for _, l := range listed {
		r := statusRow{
			Key:       l.Key,
			Holder:    l.Holder,
			ExpiresAt: serverTime{Time: l.ExpiresAt, infinite: l.NeverExpires},
			Live:      l.Live,
			State:     stateOf(l),
		}
		if !l.ReleasedAt.IsZero() {
			r.ReleasedAt = &serverTime{Time: l.ReleasedAt}
		}
		if !l.Tick.IsZero() {
			r.Tick = &serverTime{Time: l.Tick}
		}
		if !l.NeverExpires {
			in := math.Round(l.ExpiresAt.Sub(l.ServerNow).Seconds()*1000) / 1000 // to the millisecond
			r.ExpiresInSeconds = &in
		}
		if l.Fence != 0 { // fences start at 1
			r.Fence = &l.Fence
		}
		if !l.AcquiredAt.IsZero() {
			r.AcquiredAt = &serverTime{Time: l.AcquiredAt}
		}
		out = append(out, r)
	}
	return out
}

func printStatus(c *cli, rows []statusRow) error {
	w := tabwriter.NewWriter(c.stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tHOLDER\tFENCE\tACQUIRED\tEXPIRES IN\tSTATE")
	for _, r := range rows {
		state := r.State
		in := "never"
		if r.ExpiresInSeconds != nil {
			in = time.Duration(*r.ExpiresInSeconds * float64(time.Second)).Round(time.Millisecond).String()
		}
		fence, acquired := "-", "-"
		if r.Fence != nil {
			fence = fmt.Sprint(*r.Fence)
		}
		if r.AcquiredAt != nil {
			acquired = r.AcquiredAt.UTC().Format(timeFormat)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n",
			printable(r.Key), printable(r.Holder), fence, acquired, in, state)
	}
	return w.Flush()
}

// timeFormat shows server times in UTC to the millisecond.
const timeFormat = "2006-01-02T15:04:05.000Z07:00"

// printable quotes a key or holder that would break the table's layout
// (spaces, tabs, newlines, control characters).
func printable(s string) string {
	for _, r := range s {
		if r <= ' ' || r == 0x7f {
			return fmt.Sprintf("%q", s)
		}
	}
	return s
}
