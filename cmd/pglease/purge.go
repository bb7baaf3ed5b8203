package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// purgeSQL deletes rows expired longer ago than $1 seconds, as Migrate's
// purge does. Only expired rows can match: a live lease is never deleted.
// A key purged and claimed again keeps growing fences, since they come
// from the sequence.
const purgeSQL = `DELETE FROM {table} WHERE expires_at < clock_timestamp() - make_interval(secs => $1)`

var purgeCommand = command{
	name: "purge",
	summary: "Deletes the rows that expired longer ago than -older-than (required; 0 deletes\n" +
		"every expired row) and prints how many. Live leases are never touched. Needs\n" +
		"DELETE on the table. Migrate purges with a 24h horizon; this is for tables whose\n" +
		"schema is applied by a migration tool, or for a different horizon.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.Var(&c.olderThan, "older-than", "delete rows expired longer ago than this `duration` (required)")
	},
	check: func(c *cli) error {
		if !c.olderThan.set || c.olderThan.d < 0 {
			return errors.New("-older-than is required and must not be negative, e.g. -older-than 24h")
		}
		return nil
	},
	do: func(ctx context.Context, c *cli) error {
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			tag, err := conn.Exec(ctx, c.render(purgeSQL), c.olderThan.d.Seconds())
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "purged %d rows of %s expired more than %v ago\n", tag.RowsAffected(), c.table, c.olderThan.d)
			return nil
		})
	},
}

// requiredDuration is a duration flag that knows whether it was given.
type requiredDuration struct {
	d   time.Duration
	set bool
}

func (r *requiredDuration) String() string {
	if r == nil || !r.set {
		return ""
	}
	return r.d.String()
}

func (r *requiredDuration) Set(s string) error {
	d, err := time.ParseDuration(s)
	if err != nil {
		return err
	}
	r.d, r.set = d, true
	return nil
}
