// Package pgserver provides a real, throwaway PostgreSQL server for tests,
// benchmarks and demo programs, on a machine where nothing is configured.
//
// Start picks the first of these that works:
//
//  1. PGLEASE_DATABASE_URL is set and non-empty: that server is used as is.
//     It is only checked to answer; it cannot be stopped or restarted.
//  2. A Docker daemon answers GET /_ping (at DOCKER_HOST or a Docker
//     socket, within a few seconds) and PGLEASE_NO_DOCKER is not "1": a
//     postgres:16-alpine container is started with testcontainers-go, by
//     the program internal/pgcontainer (a module of its own, run with
//     `go run`). If it cannot start one, the next way is tried.
//  3. Local PostgreSQL server binaries (initdb and postgres) are found: in
//     the directory PGLEASE_PG_BINDIR names when it is set (the only one
//     tried then: it picks the major, see .ci/pgmajors), else in $PATH,
//     then through `pg_config --bindir`, then in the newest
//     /usr/lib/postgresql/*/bin. A fresh cluster is created in a temporary
//     directory and postgres runs as a child process on a free port of
//     127.0.0.1. When running as root, initdb and postgres run as the
//     "postgres" user.
//
// If none of these works, Start returns an error that says how to get one.
//
// A package's tests start with the shared helpers of internal/pgtest,
// whose Main starts the server with ForTestMain, runs the tests and ends
// with AfterTests:
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// A TestMain of its own pairs ForTestMain with AfterTests, which closes the
// server and fails the run when a goroutine is left behind:
//
//	func TestMain(m *testing.M) {
//		srv := pgserver.ForTestMain(pgserver.Options{})
//		os.Exit(srv.AfterTests(m.Run()))
//	}
//
// Tests that stop or restart a server start a private one with
// Start(ctx, Options{Private: true}) and Close it themselves.
package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"regexp"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/pgproc"
)

// EnvDatabaseURL names the environment variable holding the connection
// string of an existing server to use instead of starting one.
const EnvDatabaseURL = "PGLEASE_DATABASE_URL"

// EnvNoDocker names the environment variable that, set to "1", skips the
// Docker path.
const EnvNoDocker = "PGLEASE_NO_DOCKER"

// Options configures Start.
type Options struct {
	// Durable keeps fsync, synchronous_commit and full_page_writes on, for
	// benchmarks that measure durability. The default is fast, non-durable
	// settings. It has no effect on a server given by PGLEASE_DATABASE_URL.
	Durable bool
	// Private starts a server of the caller's own even when
	// PGLEASE_DATABASE_URL names one: for tests that stop and restart it.
	Private bool
	// Logf receives optional progress messages (which path was chosen, and
	// so on). Nil means silent.
	Logf func(format string, args ...any)
}

func (o Options) logf(format string, args ...any) {
	if o.Logf != nil {
		o.Logf(format, args...)
	}
}

// Mode is how Stop shuts the server down.
type Mode string

const (
	// Fast shuts down cleanly (SIGINT to the postmaster): open transactions
	// are rolled back and a checkpoint is written.
	Fast Mode = "fast"
	// Immediate shuts down without a checkpoint (SIGQUIT to the postmaster):
	// the next start runs crash recovery.
	Immediate Mode = "immediate"
)

// Kinds of servers, as returned by Server.Kind.
const (
	kindEnv       = "env"
	kindContainer = "container"
	kindLocal     = "local"
)

// backend is one way of running a server.
type backend interface {
	// stop stops the server; the data is kept.
	stop(ctx context.Context, mode Mode) error
	// start starts the server again after stop and returns the (possibly
	// new) connection string once it accepts connections.
	start(ctx context.Context) (string, error)
	// close stops the server and removes everything it created.
	close() error
}

// Server is a running PostgreSQL server. Its methods are safe for
// concurrent use.
type Server struct {
	kind string
	be   backend // nil for kindEnv

	mu     sync.Mutex // serializes Stop, Start, Restart and Close
	closed bool

	dsnMu sync.Mutex // guards dsn only, so DSN never waits for a restart
	dsn   string
}

// Start starts (or finds) a PostgreSQL server, in the order of preference
// described in the package documentation.
func Start(ctx context.Context, opts Options) (*Server, error) {
	if dsn := os.Getenv(EnvDatabaseURL); dsn != "" && !opts.Private {
		opts.logf("pgserver: using %s=%s", EnvDatabaseURL, Redact(dsn))
		if err := pgproc.Ping(ctx, dsn, 10*time.Second); err != nil {
			return nil, fmt.Errorf("pgserver: %s=%s does not answer: %w", EnvDatabaseURL, Redact(dsn), err)
		}
		return &Server{kind: kindEnv, dsn: dsn}, nil
	}

	var reasons []string
	if os.Getenv(EnvNoDocker) == "1" {
		reasons = append(reasons, "Docker: skipped because "+EnvNoDocker+"=1")
	} else if err := dockerAvailable(ctx); err != nil {
		opts.logf("pgserver: no Docker daemon: %v", err)
		reasons = append(reasons, fmt.Sprintf("Docker: no daemon answers (%v)", err))
	} else {
		opts.logf("pgserver: Docker daemon found, starting a postgres:16-alpine container")
		be, dsn, err := startContainer(ctx, opts)
		if err == nil {
			return &Server{kind: kindContainer, be: be, dsn: dsn}, nil
		}
		// The container program is built by `go run`, which may need the
		// network: local binaries, when there are some, still give a server.
		opts.logf("pgserver: no container: %v", err)
		reasons = append(reasons, fmt.Sprintf("Docker: the daemon answers but no container started (%v)", err))
	}

	bin, err := findBinDir()
	if err != nil {
		reasons = append(reasons, "local binaries: "+err.Error())
		return nil, noServerError(reasons)
	}
	opts.logf("pgserver: starting a local PostgreSQL from %s", bin)
	be, dsn, err := startLocal(ctx, bin, opts)
	if err != nil {
		return nil, err
	}
	return &Server{kind: kindLocal, be: be, dsn: dsn}, nil
}

func noServerError(reasons []string) error {
	msg := "pgserver: no PostgreSQL server available. Get one in any of these ways:\n" +
		"  - set " + EnvDatabaseURL + "=postgres://user:pass@host:5432/db to use an existing server;\n" +
		"  - start a Docker daemon (a postgres:16-alpine container is then started);\n" +
		"  - install PostgreSQL server binaries (initdb, postgres): `apt-get install -y postgresql` on Debian/Ubuntu, `brew install postgresql` on macOS.\n" +
		"Tried:"
	for _, r := range reasons {
		msg += "\n  - " + r
	}
	return errors.New(msg)
}

// DSN returns the current connection string. For a container it may change
// after a restart, because Docker may map the port anew.
func (s *Server) DSN() string {
	s.dsnMu.Lock()
	defer s.dsnMu.Unlock()
	return s.dsn
}

func (s *Server) setDSN(dsn string) {
	s.dsnMu.Lock()
	s.dsn = dsn
	s.dsnMu.Unlock()
}

// Kind returns "env", "container" or "local".
func (s *Server) Kind() string { return s.kind }

// CanRestart reports whether Stop, Start and Restart are possible: false for
// a server given by PGLEASE_DATABASE_URL.
func (s *Server) CanRestart() bool { return s.be != nil }

func (s *Server) check() error {
	if s.be == nil {
		return fmt.Errorf("pgserver: the server from %s cannot be stopped or restarted", EnvDatabaseURL)
	}
	if s.closed {
		return errors.New("pgserver: server is closed")
	}
	return nil
}

// Stop stops the server process and keeps its data. For "local" it sends
// SIGINT (Fast) or SIGQUIT (Immediate) to the postmaster and waits for it to
// exit, killing it after 30 s. For "container" it stops the container.
// Stopping a stopped server does nothing.
func (s *Server) Stop(mode Mode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stopLocked(mode)
}

func (s *Server) stopLocked(mode Mode) error {
	if mode != Fast && mode != Immediate {
		return fmt.Errorf("pgserver: unknown stop mode %q", mode)
	}
	if err := s.check(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	return s.be.stop(ctx, mode)
}

// Start starts the server again after Stop and waits until it accepts
// connections. A "local" server comes back on the same port; a container
// may come back on another host port, so read DSN again afterwards.
// Starting a running server does nothing.
func (s *Server) Start(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.startLocked(ctx)
}

func (s *Server) startLocked(ctx context.Context) error {
	if err := s.check(); err != nil {
		return err
	}
	dsn, err := s.be.start(ctx)
	if err != nil {
		return err
	}
	s.setDSN(dsn)
	return nil
}

// Restart stops the server with mode, then starts it again, as one step
// with respect to the other methods.
func (s *Server) Restart(ctx context.Context, mode Mode) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if err := s.stopLocked(mode); err != nil {
		return err
	}
	return s.startLocked(ctx)
}

// Close stops the server (Fast) and removes everything it created: the
// temporary directory, or the container. It is idempotent, and does
// nothing for a server given by PGLEASE_DATABASE_URL.
func (s *Server) Close() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.be == nil || s.closed {
		return nil
	}
	s.closed = true
	return s.be.close()
}

// ForTestMain starts a server for a test binary, or prints why it could not
// and exits 1 (never skips: a test run without a database must fail loudly).
// It prints one line to stderr naming the kind of server and its redacted
// connection string. Pass m.Run's result to AfterTests.
func ForTestMain(opts Options) *Server {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	srv, err := Start(ctx, opts)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	ctx, cancel = context.WithTimeout(context.Background(), 30*time.Second)
	num, version, err := srv.Version(ctx)
	cancel()
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		_ = srv.Close()
		os.Exit(1)
	}
	fmt.Fprintf(os.Stderr, "pgserver: using %s PostgreSQL %s (server_version_num %d) at %s\n",
		srv.Kind(), version, num, Redact(srv.DSN()))
	return srv
}

// Version returns the server's version as a number, server_version_num
// (180004 for 18.4, 140023 for 14.23), and as text, the first word of
// server_version ("18.4"; a distribution's build adds its own words). The
// major is num / 10000.
func (s *Server) Version(ctx context.Context) (num int, version string, err error) {
	cfg, err := pgx.ParseConfig(s.DSN())
	if err != nil {
		return 0, "", fmt.Errorf("pgserver: %w", err)
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return 0, "", fmt.Errorf("pgserver: reading the server's version: %w", err)
	}
	defer func() { _ = conn.Close(context.Background()) }()
	if err := conn.QueryRow(ctx,
		`SELECT current_setting('server_version_num')::int, current_setting('server_version')`).Scan(&num, &version); err != nil {
		return 0, "", fmt.Errorf("pgserver: reading the server's version: %w", err)
	}
	if f := strings.Fields(version); len(f) > 0 {
		version = f[0]
	}
	return num, version, nil
}

// redacted is what Redact puts in place of a password.
const redacted = "xxxxx"

var (
	urlPasswordParam = regexp.MustCompile(`(?i)([?&]password=)[^&#]*`)
	kvPassword       = regexp.MustCompile(`(?i)(\bpassword\s*=\s*)('(?:[^'\\]|\\.)*'|\S*)`)
)

// Redact returns dsn with any password replaced by "xxxxx", so that it can
// be printed. It handles URLs (postgres://user:pass@host/db?password=...)
// and keyword/value strings (host=h password=secret). When in doubt it
// hides more rather than less.
func Redact(dsn string) string {
	i := strings.Index(dsn, "://")
	if i < 0 {
		return kvPassword.ReplaceAllString(dsn, "${1}"+redacted)
	}
	prefix, rest := dsn[:i+3], dsn[i+3:]
	// The user info ends at the last '@' of the authority, as url.Parse
	// reads it. If the authority has none but the rest has one, the
	// password may hold a raw '/' or '?': hide up to the last '@'.
	authority := rest
	if j := strings.IndexAny(rest, "/?#"); j >= 0 {
		authority = rest[:j]
	}
	at := strings.LastIndex(authority, "@")
	if at < 0 {
		at = strings.LastIndex(rest, "@")
	}
	if at >= 0 {
		if c := strings.Index(rest[:at], ":"); c >= 0 {
			rest = rest[:c+1] + redacted + rest[at:]
		}
	}
	return prefix + urlPasswordParam.ReplaceAllString(rest, "${1}"+redacted)
}

// AfterTests ends a test binary's use of the server that ForTestMain
// started: it closes the server, then, if the tests passed, fails the run
// when any goroutine is left behind (goleak), but for those ignore names
// (a dependency's that never ends). It returns the exit code:
//
//	func TestMain(m *testing.M) {
//		server = pgserver.ForTestMain(pgserver.Options{})
//		os.Exit(server.AfterTests(m.Run()))
//	}
func (s *Server) AfterTests(code int, ignore ...goleak.Option) int {
	if err := s.Close(); err != nil {
		fmt.Fprintln(os.Stderr, "pgserver: closing the test server:", err)
		code = 1
	}
	if code == 0 {
		if err := goleak.Find(ignore...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}
