package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// envDSN names the environment variable read when -dsn is not given; it
// is the one the tests and the demo use too.
const envDSN = "PGLEASE_DATABASE_URL"

// libpqEnv are the environment variables of libpq that say which server to
// reach, read (as psql reads them) when neither -dsn nor envDSN is given.
var libpqEnv = []string{"PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGPASSWORD"}

// libpqEnvSet reports whether any of libpqEnv is set: without any, there
// is no database to reach, rather than libpq's default one.
func libpqEnvSet() bool {
	for _, name := range libpqEnv {
		if os.Getenv(name) != "" {
			return true
		}
	}
	return false
}

// redacted replaces a password wherever it could appear in a message.
const redacted = "xxxxx"

// cli holds what every command shares: its output, the common flags once
// checked, and the arguments.
type cli struct {
	stdout, stderr io.Writer
	args           []string

	dsn     string
	table   string
	timeout time.Duration

	// Flags of single commands.
	retention time.Duration    // migrate
	olderThan requiredDuration // purge
	jsonOut   bool             // status, runs
	job       string           // runs
	since     time.Duration    // runs
	now       bool             // release
	addr      string           // ui
	buttons   bool             // ui

	conn     *pgx.ConnConfig // parsed from dsn
	password string          // hidden from every message
}

// commonFlags registers -dsn, -table and -timeout. The default of -dsn is
// not shown by -h, since it holds a password.
func (c *cli) commonFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.dsn, "dsn", "", "PostgreSQL connection `string` (default $"+envDSN+", else libpq's "+strings.Join(libpqEnv, ", ")+")")
	fs.StringVar(&c.table, "table", sqlstmt.DefaultTable, "lease table, \"name\" or \"schema.name\"")
	fs.DurationVar(&c.timeout, "timeout", 30*time.Second, "bound of the whole command (of ui: of each reading of its page)")
}

// checkCommon validates the common flags, before anything is sent.
func (c *cli) checkCommon() error {
	if c.dsn == "" {
		c.dsn = os.Getenv(envDSN)
	}
	if c.dsn == "" && !libpqEnvSet() {
		return fmt.Errorf("no database: give -dsn, or set %s, or libpq's %s as for psql", envDSN, strings.Join(libpqEnv, ", "))
	}
	// An empty string is read from libpq's environment variables, as psql
	// reads them.
	cfg, err := pgx.ParseConfig(c.dsn)
	if err != nil {
		// The parser's message may quote the string, password included.
		return errors.New("-dsn: not a valid PostgreSQL connection string (want postgres://user:password@host:port/db or host=... user=... key/value pairs)")
	}
	c.conn, c.password = cfg, cfg.Password
	// The library's own check: the name must be a plain identifier, or
	// schema.identifier, short enough for its sequence's name.
	if _, err := pglease.Schema(pglease.WithTable(c.table)); err != nil {
		return fmt.Errorf("-table: %s", strings.TrimPrefix(err.Error(), "pglease: WithTable: "))
	}
	if c.timeout <= 0 {
		return fmt.Errorf("-timeout %v: must be positive", c.timeout)
	}
	return nil
}

// target names the server for messages: user@host:port/database, which
// by construction holds no password.
func (c *cli) target() string {
	return fmt.Sprintf("%s@%s:%d/%s", c.conn.User, c.conn.Host, c.conn.Port, c.conn.Database)
}

// admin is the Admin of the -table on conn.
func (c *cli) admin(conn *pgx.Conn) (*pglease.Admin, error) {
	return pglease.NewAdmin(conn, pglease.WithTable(c.table))
}

// connect opens one connection; the caller closes it.
func (c *cli) connect(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, c.conn)
	if err != nil {
		return nil, fmt.Errorf("connecting to %s: %w", c.target(), err)
	}
	return conn, nil
}

// withConn runs f on a fresh connection and closes it.
func (c *cli) withConn(ctx context.Context, f func(*pgx.Conn) error) error {
	conn, err := c.connect(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close(context.WithoutCancel(ctx)) }()
	return explain(f(conn), c.table)
}

// scrub hides the password in a message, should a driver or server error
// ever quote it.
func (c *cli) scrub(msg string) string {
	if c.password == "" {
		return msg
	}
	return strings.ReplaceAll(msg, c.password, redacted)
}

// explain adds what to do to the errors an operator is likely to meet.
func explain(err error, table string) error {
	switch driver.Code(err) {
	case driver.UndefinedTable:
		return fmt.Errorf("%w (is -table %q right? create it with: pglease migrate -table %s)", err, table, table)
	case driver.InsufficientPrivilege:
		return fmt.Errorf("%w (status needs SELECT, release SELECT and UPDATE, purge DELETE on the table; migrate runs as the table's owner)", err)
	}
	return err
}
