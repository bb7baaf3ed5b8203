package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/pgleaseui"
)

var uiCommand = command{
	name:  "ui",
	serve: true,
	summary: "Serves the web page of the table on -addr until interrupted: every key with its\n" +
		"holder, fence, time left and state, the holders with their leases, and each job's\n" +
		"recent runs as a timeline, refreshed live, all by the database's clock. Read-only\n" +
		"unless -buttons adds Revoke and ForceExpire (each asks for confirmation); it has no\n" +
		"authentication of its own, so keep -addr on localhost or behind one. -timeout\n" +
		"bounds each reading of the page rather than the command.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.StringVar(&c.addr, "addr", "127.0.0.1:8089", "`host:port` to serve the page on")
		fs.BoolVar(&c.buttons, "buttons", false, "show Revoke and ForceExpire buttons (needs UPDATE on the table)")
		fs.DurationVar(&c.since, "since", time.Hour, "show the runs started within this long")
	},
	check: func(c *cli) error {
		if c.since <= 0 {
			return fmt.Errorf("-since %v: must be positive", c.since)
		}
		return nil
	},
	do: func(ctx context.Context, c *cli) error {
		cfg, err := pgxpool.ParseConfig(c.dsn) // parsed once already by checkCommon
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", c.target(), err)
		}
		cfg.MaxConns = 4
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return fmt.Errorf("connecting to %s: %w", c.target(), err)
		}
		defer pool.Close()
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(c.table))
		if err != nil {
			return err
		}
		// The table must be there before the page is served: its errors
		// are the operator's to read here, with what to do.
		first, cancel := context.WithTimeout(ctx, c.timeout)
		_, err = admin.List(first)
		cancel()
		if err != nil {
			return explain(fmt.Errorf("reading %s on %s: %w", c.table, c.target(), err), c.table)
		}
		opts := []pgleaseui.Option{pgleaseui.WithRuns(30, c.since)}
		if c.buttons {
			opts = append(opts, pgleaseui.WithAdminButtons())
		}
		ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", c.addr)
		if err != nil {
			return fmt.Errorf("-addr: %w", err)
		}
		srv := &http.Server{
			Handler:           http.TimeoutHandler(pgleaseui.Handler(admin, opts...), c.timeout, "pglease ui: the database did not answer within -timeout"),
			ReadHeaderTimeout: 10 * time.Second,
		}
		fmt.Fprintf(c.stdout, "pglease ui: the page of %s at %s is on http://%s/ (interrupt to stop)\n", c.table, c.target(), ln.Addr())
		served := make(chan error, 1)
		go func() { served <- srv.Serve(ln) }()
		select {
		case err = <-served:
			return err
		case <-ctx.Done():
		}
		stop, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		err = srv.Shutdown(stop)
		if served := <-served; !errors.Is(served, http.ErrServerClosed) {
			err = errors.Join(err, served)
		}
		return err
	},
}
