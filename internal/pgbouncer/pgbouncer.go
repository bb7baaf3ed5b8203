// Package pgbouncer runs a real PgBouncer in front of a test server, so that
// tests can prove pglease works through a transaction pooler.
//
// The pgbouncer binary is looked up in $PATH, then in /usr/sbin,
// /usr/local/sbin and /usr/local/bin (Debian installs it in /usr/sbin, which
// is often not in a user's $PATH). Each Bouncer has its own temporary
// directory, configuration, user list and port on 127.0.0.1: it neither
// needs nor disturbs a system PgBouncer (the Debian package may start one on
// port 6432). When running as root, pgbouncer runs as the "postgres" user,
// because it refuses to run as root.
//
// A missing binary is an error that says how to install it: tests that use
// New fail, they never skip.
package pgbouncer

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/pgproc"
)

const (
	readyTimeout = 30 * time.Second // for pgbouncer to accept connections
	stopTimeout  = 10 * time.Second // for pgbouncer to exit after SIGTERM
	portAttempts = 3
)

// Install says how to get the binary.
const Install = "install PgBouncer: `apt-get install -y pgbouncer` on Debian/Ubuntu " +
	"(the binary is /usr/sbin/pgbouncer), `brew install pgbouncer` on macOS"

// Options configures a Bouncer.
type Options struct {
	// PoolMode is "session", "transaction" or "statement". The default is
	// "transaction", the mode that breaks session state.
	PoolMode string
	// PoolSize is default_pool_size: server connections per user and
	// database. The default is 4.
	PoolSize int
	// MaxPreparedStatements, when positive, sets max_prepared_statements so
	// that PgBouncer (1.21 and later) tracks protocol-level prepared
	// statements across server connections. Older versions refuse to start
	// with it.
	MaxPreparedStatements int
}

// Bouncer is a running pgbouncer process.
type Bouncer struct {
	version  []int
	dir      string
	port     int
	database string
	user     string
	proc     *pgproc.Proc
}

// New starts a Bouncer in front of the server at upstream (a connection
// string) and stops it at cleanup. It fails the test if it cannot, saying
// how to install PgBouncer when it is missing.
func New(tb testing.TB, upstream string, opts Options) *Bouncer {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), readyTimeout)
	defer cancel()
	b, err := Start(ctx, upstream, opts)
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if err := b.Close(); err != nil {
			tb.Error(err)
		}
	})
	return b
}

// Find returns the path of the pgbouncer binary and its version, as in
// [1 21 0].
func Find() (string, []int, error) {
	path, err := exec.LookPath("pgbouncer")
	if err != nil {
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/usr/local/bin"} {
			p := filepath.Join(dir, "pgbouncer")
			if fi, statErr := os.Stat(p); statErr == nil && !fi.IsDir() && fi.Mode()&0o111 != 0 {
				path, err = p, nil
				break
			}
		}
	}
	if err != nil {
		return "", nil, fmt.Errorf("pgbouncer: no pgbouncer binary in $PATH, /usr/sbin, /usr/local/sbin or /usr/local/bin; %s", Install)
	}
	out, err := exec.CommandContext(context.Background(), path, "--version").CombinedOutput()
	if err != nil {
		return "", nil, fmt.Errorf("pgbouncer: %s --version: %w\n%s", path, err, out)
	}
	v := parseVersion(string(out))
	if v == nil {
		return "", nil, fmt.Errorf("pgbouncer: %s --version printed no version: %q", path, out)
	}
	return path, v, nil
}

var versionRE = regexp.MustCompile(`PgBouncer (\d+)\.(\d+)(?:\.(\d+))?`)

// parseVersion reads "PgBouncer 1.18.0" into [1 18 0]; nil if absent.
func parseVersion(s string) []int {
	m := versionRE.FindStringSubmatch(s)
	if m == nil {
		return nil
	}
	var v []int
	for _, part := range m[1:] {
		n, _ := strconv.Atoi(part) // a missing patch level is 0
		v = append(v, n)
	}
	return v
}

// AtLeast reports whether version v is major.minor or later.
func AtLeast(v []int, major, minor int) bool {
	if len(v) < 2 {
		return false
	}
	return v[0] > major || v[0] == major && v[1] >= minor
}

// Start starts pgbouncer in front of upstream and returns once it accepts
// connections. Close stops it.
func Start(ctx context.Context, upstream string, opts Options) (_ *Bouncer, err error) {
	bin, version, err := Find()
	if err != nil {
		return nil, err
	}
	up, err := pgconn.ParseConfig(upstream)
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: upstream: %w", err)
	}
	if opts.PoolMode == "" {
		opts.PoolMode = "transaction"
	}
	if opts.PoolSize == 0 {
		opts.PoolSize = 4
	}
	if opts.MaxPreparedStatements > 0 && !AtLeast(version, 1, 21) {
		return nil, fmt.Errorf("pgbouncer: max_prepared_statements needs PgBouncer 1.21 or later, %s is %s", bin, versionString(version))
	}

	dir, cred, err := pgproc.MkdirTemp("pglease-pgbouncer-*")
	if err != nil {
		return nil, fmt.Errorf("pgbouncer: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()

	b := &Bouncer{version: version, dir: dir, database: up.Database, user: up.User}
	if _, err := pgproc.OnFreePort(portAttempts, func(port int) error {
		b.port = port
		if err := b.writeConfig(up, opts, cred); err != nil {
			return err
		}
		return b.launch(ctx, bin, cred)
	}); err != nil {
		return nil, err
	}
	return b, nil
}

func (b *Bouncer) configPath() string { return filepath.Join(b.dir, "pgbouncer.ini") }
func (b *Bouncer) logPath() string    { return filepath.Join(b.dir, "pgbouncer.log") }

// writeConfig writes pgbouncer.ini and userlist.txt, readable only by the
// user pgbouncer runs as (cred, when not nil). Clients are trusted; the
// upstream credentials, if any, are in the [databases] entry.
func (b *Bouncer) writeConfig(up *pgconn.Config, opts Options, cred *syscall.Credential) error {
	conn := fmt.Sprintf("host=%s port=%d dbname=%s user=%s", up.Host, up.Port, quote(up.Database), quote(up.User))
	if up.Password != "" {
		conn += " password=" + quote(up.Password)
	}
	ini := fmt.Sprintf(`[databases]
%s = %s

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = %d
unix_socket_dir =
auth_type = trust
auth_file = %s
pool_mode = %s
default_pool_size = %d
max_client_conn = 500
server_tls_sslmode = disable
ignore_startup_parameters = extra_float_digits
`, quote(up.Database), conn, b.port, filepath.Join(b.dir, "userlist.txt"), opts.PoolMode, opts.PoolSize)
	if opts.MaxPreparedStatements > 0 {
		ini += fmt.Sprintf("max_prepared_statements = %d\n", opts.MaxPreparedStatements)
	}
	users := fmt.Sprintf("%q \"\"\n", up.User)
	for path, content := range map[string]string{b.configPath(): ini, filepath.Join(b.dir, "userlist.txt"): users} {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
		if err := pgproc.Chown(path, cred); err != nil {
			return fmt.Errorf("pgbouncer: %w", err)
		}
	}
	return nil
}

// quote quotes a value of a libpq-style connection string for PgBouncer.
func quote(s string) string {
	if s != "" && !strings.ContainsAny(s, " '\\=") {
		return s
	}
	return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
}

// launch runs pgbouncer on b.port and waits until a query goes through it.
// On failure no process is left; the error wraps pgproc.ErrPortInUse when
// the port was taken.
func (b *Bouncer) launch(ctx context.Context, bin string, cred *syscall.Credential) error {
	cmd := exec.CommandContext(context.Background(), bin, b.configPath()) // stopped by a signal, not a context
	pgproc.Prepare(cmd, b.dir, cred)
	p, err := pgproc.Launch(ctx, cmd, b.logPath(), b.DSN(), readyTimeout)
	if err != nil {
		return fmt.Errorf("pgbouncer: %s on port %d did not start: %w", bin, b.port, err)
	}
	b.proc = p
	return nil
}

// DSN is the connection string of the bouncer, for the upstream's database
// and user.
func (b *Bouncer) DSN() string {
	return fmt.Sprintf("postgres://%s@127.0.0.1:%d/%s?sslmode=disable", b.user, b.port, b.database)
}

// Version is the version of the running pgbouncer, as in [1 21 0].
func (b *Bouncer) Version() []int { return append([]int(nil), b.version...) }

// Close stops pgbouncer (SIGTERM, then SIGKILL after a while) and removes
// its directory.
func (b *Bouncer) Close() error {
	err := b.proc.Stop(syscall.SIGTERM, stopTimeout)
	if err != nil {
		err = fmt.Errorf("pgbouncer: %w", err)
	}
	if rmErr := os.RemoveAll(b.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgbouncer: %w", rmErr))
	}
	return err
}

func versionString(v []int) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.Itoa(n)
	}
	return strings.Join(parts, ".")
}
