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
)

// statusSQL lists every row with the server's time, read once (the CTE is
// evaluated once) so that every row is judged against the same instant,
// and on the database clock, the only one pglease trusts. Keys are sorted
// byte-wise (COLLATE "C") so that the order does not depend on the
// database's locale. fence and acquired_at are read through to_jsonb of the
// row, so that a table without them (pglease.WithoutFenceColumn) lists too,
// with nulls.
const statusSQL = `WITH server AS (SELECT clock_timestamp() AS now)
SELECT key, holder, (to_jsonb(t) ->> 'fence')::bigint, (to_jsonb(t) ->> 'acquired_at')::timestamptz, expires_at, server.now
  FROM {table} AS t, server
 ORDER BY key COLLATE "C"`

// statusRow is one key as status -json prints it.
type statusRow struct {
	Key              string     `json:"key"`
	Holder           string     `json:"holder"`
	Fence            *int64     `json:"fence"`       // null on a table without fence column
	AcquiredAt       *time.Time `json:"acquired_at"` // null on a table without acquired_at
	ExpiresAt        time.Time  `json:"expires_at"`
	ExpiresInSeconds float64    `json:"expires_in_seconds"` // negative once expired
	Live             bool       `json:"live"`
}

var statusCommand = command{
	name: "status",
	summary: "Lists every key of the table, sorted: its holder, its current fence, when it was\n" +
		"acquired, how long until it expires (negative: expired that long ago) and whether\n" +
		"it is live, all by the database's clock. -json prints a JSON array of objects with\n" +
		"key, holder, fence, acquired_at, expires_at, expires_in_seconds and live.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.BoolVar(&c.jsonOut, "json", false, "print JSON instead of a table")
	},
	do: func(ctx context.Context, c *cli) error {
		var rows []statusRow
		err := c.withConn(ctx, func(conn *pgx.Conn) error {
			var err error
			rows, err = readStatus(ctx, conn, c.render(statusSQL))
			return err
		})
		if err != nil {
			return err
		}
		if c.jsonOut {
			enc := json.NewEncoder(c.stdout)
			enc.SetIndent("", "  ")
			return enc.Encode(rows)
		}
		return printStatus(c, rows)
	},
}

func readStatus(ctx context.Context, conn *pgx.Conn, sql string) ([]statusRow, error) {
	dbRows, err := conn.Query(ctx, sql)
	if err != nil {
		return nil, err
	}
	out := []statusRow{} // [] rather than null in JSON
	for dbRows.Next() {
		var (
			r   statusRow
			now time.Time
		)
		if err := dbRows.Scan(&r.Key, &r.Holder, &r.Fence, &r.AcquiredAt, &r.ExpiresAt, &now); err != nil {
			dbRows.Close()
			return nil, err
		}
		r.ExpiresInSeconds = math.Round(r.ExpiresAt.Sub(now).Seconds()*1000) / 1000 // to the millisecond
		r.Live = r.ExpiresAt.After(now)
		out = append(out, r)
	}
	return out, dbRows.Err()
}

func printStatus(c *cli, rows []statusRow) error {
	w := tabwriter.NewWriter(c.stdout, 0, 8, 2, ' ', 0)
	fmt.Fprintln(w, "KEY\tHOLDER\tFENCE\tACQUIRED\tEXPIRES IN\tSTATE")
	for _, r := range rows {
		state := "expired"
		if r.Live {
			state = "live"
		}
		in := time.Duration(r.ExpiresInSeconds * float64(time.Second)).Round(time.Millisecond)
		fence, acquired := "-", "-"
		if r.Fence != nil {
			fence = fmt.Sprint(*r.Fence)
		}
		if r.AcquiredAt != nil {
			acquired = r.AcquiredAt.UTC().Format(timeFormat)
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%v\t%s\n",
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
