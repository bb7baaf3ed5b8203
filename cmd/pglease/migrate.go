package main

import (
	"context"
	"flag"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/sqlstmt"
)

var migrateCommand = command{
	name: "migrate",
	summary: "Creates the fence sequence and the lease table if they do not exist, then purges\n" +
		"rows expired longer ago than -retention, as pglease.Migrate does. Idempotent and\n" +
		"safe to run from several places at once. Needs CREATE on the schema and DELETE\n" +
		"on the table: run it as the table's owner.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.DurationVar(&c.retention, "retention", sqlstmt.DefaultRetention, "purge rows expired longer ago than this (at least 1h)")
	},
	check: func(c *cli) error {
		return checkHorizon("-retention", c.retention)
	},
	do: func(ctx context.Context, c *cli) error {
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			if err := pglease.Migrate(ctx, conn, pglease.WithTable(c.table), pglease.WithRetention(c.retention)); err != nil {
				return err
			}
			fmt.Fprintf(c.stdout, "table %s and sequence %s_fence_seq are ready; rows expired more than %v ago were purged\n",
				c.table, c.table, c.retention)
			return nil
		})
	},
}
