package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

var purgeCommand = command{
	name: "purge",
	summary: "Deletes the rows that expired longer ago than -older-than (required, at least\n" +
		"1h) and prints how many. Live leases are never touched. Needs DELETE on the\n" +
		"table. Migrate purges with a 24h horizon; this is for tables whose schema is\n" +
		"applied by a migration tool, or for a different horizon.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.Var(&c.olderThan, "older-than", "delete rows expired longer ago than this `duration` (required)")
	},
	check: func(c *cli) error {
		if !c.olderThan.set {
			return errors.New("-older-than is required, e.g. -older-than 24h")
		}
		return checkHorizon("-older-than", c.olderThan.d)
	},
	do: func(ctx context.Context, c *cli) error {
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			admin, err := c.admin(conn)
			if err != nil {
				return err
			}
			n, err := admin.Purge(ctx, c.olderThan.d)
			if err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "purged %d rows of %s expired more than %v ago\n", n, c.table, c.olderThan.d)
			return nil
		})
	},
}

// checkHorizon refuses a purge horizon below an hour (sqlstmt.MinRetention), saying
// why, as a usage error before anything is sent (Admin.Purge and
// pglease.Migrate refuse it too).
func checkHorizon(flag string, d time.Duration) error {
	if d < sqlstmt.MinRetention {
		return fmt.Errorf("%s %v: must be at least %v: a claim draws its fence before it inserts its row, and a shorter purge horizon would let a claim stalled in between issue a fence smaller than one already handed out", flag, d, sqlstmt.MinRetention)
	}
	return nil
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
