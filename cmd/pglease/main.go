// Command pglease is the operator's tool for a pglease lease table: create
// it, look at it, purge old rows, and revoke a lease.
//
// Usage:
//
//	pglease <command> [flags] [args]
//
//	migrate          create the fence sequence and the table if missing, purge old rows
//	status [-json]   list every key: holder, fence, acquired, expires in, state
//	runs [-job KEY] [-since D] [-json]
//	                 list the runs of jobs with ticks: tick, fence, holder, took, outcome
//	purge            delete rows expired longer ago than -older-than
//	release KEY      revoke the lease on KEY: its holder loses it at its next heartbeat,
//	                 and any holder can claim it once it would have expired
//	release -now KEY expire the lease on KEY now (unsafe: two replicas may believe at once)
//	ui [-addr A]     serve the web page of the table (pgleaseui) on A, 127.0.0.1:8089 by default
//
// Every command takes -dsn (default $PGLEASE_DATABASE_URL, else libpq's
// PGHOST, PGPORT, PGUSER, PGDATABASE and PGPASSWORD, as psql reads them),
// -table (default "lease") and -timeout (of ui: of each reading of its page). Exit status: 0 success, 1 operational failure
// (database error, key not found), 2 usage error.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
)

// Exit codes, for scripts.
const (
	exitOK    = 0 // the command did what was asked
	exitFail  = 1 // operational failure: database error, key not found
	exitUsage = 2 // bad command, flag or argument
)

const usageText = `pglease: the operator's tool for a pglease lease table.

Usage:
  pglease <command> [flags] [args]

Commands:
  migrate          create the fence sequence and the table if missing (idempotent),
                   then purge rows expired longer ago than -retention
  status           list every key, sorted: holder, fence, acquired, expires in,
                   state: live, released, lapsed or revoked (-json for machine output)
  runs             list the runs of jobs with ticks from the ledger: tick, fence,
                   holder, start, duration, outcome (completed, lapsed...);
                   -job KEY, -since 24h, -json
  purge            delete rows expired longer ago than -older-than; prints how many
  release KEY      revoke the lease on KEY: its holder loses it at its next
                   heartbeat, and any holder can claim it (with a greater fence)
                   once it would have expired, never while its holder may still
                   believe in it
  release -now KEY expire the lease on KEY at once, so that any holder can claim
                   it now. UNSAFE: its holder believes in it until its next
                   heartbeat (or up to the old expiry if that fails), so two
                   replicas may run the job at once; prints that warning
  ui               serve the web page of the table on -addr (127.0.0.1:8089)
                   until interrupted: keys, holders and each job's runs,
                   refreshed live; read-only unless -buttons adds Revoke and
                   ForceExpire. No authentication: keep it on localhost

Flags of every command:
  -dsn string      PostgreSQL connection string (default $PGLEASE_DATABASE_URL,
                   else libpq's PGHOST, PGPORT, PGUSER, PGDATABASE, PGPASSWORD
                   as psql reads them)
  -table string    lease table, "name" or "schema.name" (default "lease")
  -timeout dur     bound of the whole command; of ui, of each reading of its
                   page (default 30s)

Run "pglease <command> -h" for the flags of one command.

Exit status:
  0  success
  1  operational failure: database unreachable or refusing, table missing,
     key not found
  2  usage error: unknown command, bad flag or argument
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// command is one subcommand. Its own flags are added to the common ones;
// check validates them once parsed, and do runs the command.
type command struct {
	name    string
	args    string // the positional arguments, for the usage line
	nargs   int
	serve   bool // runs until interrupted: -timeout bounds each of its readings, not the whole
	summary string
	flags   func(fs *flag.FlagSet, c *cli) // optional
	check   func(c *cli) error             // optional
	do      func(ctx context.Context, c *cli) error
}

var commands = []command{migrateCommand, statusCommand, runsCommand, purgeCommand, releaseCommand, uiCommand}

// wrongArgs says that a command that takes want positional arguments,
// named names (for the usage line), was given got.
func wrongArgs(want int, names string, got int) string {
	switch want {
	case 0:
		return fmt.Sprintf("takes no arguments, got %d", got)
	case 1:
		return fmt.Sprintf("takes one argument, %s; got %d", names, got)
	default:
		return fmt.Sprintf("takes %d arguments, %s; got %d", want, names, got)
	}
}

// run is the whole program, testable in-process: it returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		fmt.Fprint(stderr, usageText)
		return exitUsage
	}
	switch args[0] {
	case "-h", "-help", "--help", "help":
		fmt.Fprint(stdout, usageText)
		return exitOK
	}
	var cmd *command
	for i := range commands {
		if commands[i].name == args[0] {
			cmd = &commands[i]
		}
	}
	if cmd == nil {
		fmt.Fprintf(stderr, "pglease: unknown command %q\n\n%s", args[0], usageText)
		return exitUsage
	}

	c := &cli{stdout: stdout, stderr: stderr}
	fs := flag.NewFlagSet("pglease "+cmd.name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "Usage: pglease %s [flags] %s\n\n%s\n\nFlags:\n", cmd.name, cmd.args, cmd.summary)
		fs.PrintDefaults()
		fmt.Fprint(fs.Output(), "\nExit status: 0 success, 1 operational failure, 2 usage error.\n")
	}
	c.commonFlags(fs)
	if cmd.flags != nil {
		cmd.flags(fs, c)
	}
	pos, err := parseInterspersed(fs, args[1:])
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return exitOK
		}
		return exitUsage // the flag package has printed the error and usage
	}
	if len(pos) != cmd.nargs {
		fmt.Fprintf(stderr, "pglease %s: %s\n", cmd.name, wrongArgs(cmd.nargs, cmd.args, len(pos)))
		fs.Usage()
		return exitUsage
	}
	c.args = pos
	if err := c.checkCommon(); err != nil {
		fmt.Fprintf(stderr, "pglease %s: %v\n", cmd.name, err)
		return exitUsage
	}
	if cmd.check != nil {
		if err := cmd.check(c); err != nil {
			fmt.Fprintf(stderr, "pglease %s: %v\n", cmd.name, err)
			return exitUsage
		}
	}

	if !cmd.serve {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.timeout)
		defer cancel()
	}
	if err := cmd.do(ctx, c); err != nil {
		// The library's errors start with "pglease: ", which the command's
		// own prefix already says.
		fmt.Fprintf(stderr, "pglease %s: %s\n", cmd.name, c.scrub(strings.TrimPrefix(err.Error(), "pglease: ")))
		return exitFail
	}
	return exitOK
}

// parseInterspersed parses flags before and after the positional
// arguments (pglease release KEY -table t), which the flag package alone
// stops at. After "--" everything is positional, for a key that starts
// with "-".
func parseInterspersed(fs *flag.FlagSet, args []string) ([]string, error) {
	var pos []string
	for {
		if err := fs.Parse(args); err != nil {
			return nil, err
		}
		rest := fs.Args()
		if len(rest) == 0 {
			return pos, nil
		}
		if used := len(args) - len(rest); used > 0 && args[used-1] == "--" {
			return append(pos, rest...), nil
		}
		pos = append(pos, rest[0])
		args = rest[1:]
	}
}
