package pgserver

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/pglease/pglease/internal/pgproc"
)

// Local servers: initdb and postgres from binaries found on this machine,
// in a temporary directory, postgres being a child process of ours.

const (
	readyTimeout = 60 * time.Second // for postgres to accept connections
	stopTimeout  = 30 * time.Second // for postgres to exit after a signal
	crashTimeout = 10 * time.Second // for postgres to exit after SIGQUIT, before it is killed
	portAttempts = 3                // fresh ports tried by the first start
)

// findBinDir finds the directory holding initdb and postgres: the one
// PGLEASE_PG_BINDIR names, else the one of either program in $PATH
// (symlinks resolved), then `pg_config --bindir`, then the newest
// /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
	if dir := os.Getenv(EnvBinDir); dir != "" {
		return givenBinDir(dir, hasServerBinaries)
	}
	var pathDirs []string
	for _, name := range []string{"initdb", "postgres"} {
		p, err := exec.LookPath(name)
		if err != nil {
			continue
		}
		if r, err := filepath.EvalSymlinks(p); err == nil {
			p = r
		}
		pathDirs = append(pathDirs, filepath.Dir(p))
	}
	var pgConfigDir string
	if out, err := exec.CommandContext(context.Background(), "pg_config", "--bindir").Output(); err == nil {
		pgConfigDir = strings.TrimSpace(string(out))
	}
	versionDirs, _ := filepath.Glob("/usr/lib/postgresql/*/bin")
	if dir, ok := chooseBinDir(pathDirs, pgConfigDir, versionDirs, hasServerBinaries); ok {
		return dir, nil
	}
	return "", errors.New("initdb and postgres not found in $PATH, `pg_config --bindir` or /usr/lib/postgresql/*/bin")
}

// givenBinDir checks the directory PGLEASE_PG_BINDIR names: it is the one
// used, or none is. Another one found instead would run another major than
// the one asked for.
func givenBinDir(dir string, hasBoth func(dir string) bool) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", fmt.Errorf("pgserver: %s=%s: %w", EnvBinDir, dir, err)
	}
	if !hasBoth(abs) {
		return "", fmt.Errorf("pgserver: %s=%s holds no initdb and postgres: set it to a server's bin directory "+
			"(.ci/pgmajors 18 prints one) or unset it to use the local binaries", EnvBinDir, dir)
	}
	return abs, nil
}

// chooseBinDir returns the first directory for which hasBoth is true: the
// pathDirs in order, then pgConfigDir, then versionDirs
// (/usr/lib/postgresql/<version>/bin), newest version first.
func chooseBinDir(pathDirs []string, pgConfigDir string, versionDirs []string, hasBoth func(dir string) bool) (string, bool) {
	candidates := append([]string{}, pathDirs...)
	if pgConfigDir != "" {
		candidates = append(candidates, pgConfigDir)
	}
	sorted := append([]string{}, versionDirs...)
	sort.SliceStable(sorted, func(i, j int) bool {
		return versionLess(dirVersion(sorted[j]), dirVersion(sorted[i]))
	})
	candidates = append(candidates, sorted...)
	for _, dir := range candidates {
		if hasBoth(dir) {
			return dir, true
		}
	}
	return "", false
}

// dirVersion parses "15" or "9.6" out of /usr/lib/postgresql/<v>/bin;
// nil when it is not a version.
func dirVersion(binDir string) []int {
	var v []int
	for _, part := range strings.Split(filepath.Base(filepath.Dir(binDir)), ".") {
		n, err := strconv.Atoi(part)
		if err != nil {
			return nil
		}
		v = append(v, n)
	}
	return v
}

// versionLess compares versions numerically; nil sorts first.
func versionLess(a, b []int) bool {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return len(a) < len(b)
}

func hasServerBinaries(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			return false
		}
	}
	return true
}

// localServer is a postgres child process over a cluster in dir/data.
type localServer struct {
	bin     string // directory of initdb and postgres
	dir     string // temporary directory: data/, postgres.log
	port    int
	durable bool
	cred    *syscall.Credential // nil unless we run as root
	logf    func(format string, args ...any)
	proc    *pgproc.Proc // nil when stopped
}

func (l *localServer) dataDir() string { return filepath.Join(l.dir, "data") }
func (l *localServer) logPath() string { return filepath.Join(l.dir, "postgres.log") }

func (l *localServer) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", l.port)
}

// startLocal creates a cluster in a fresh temporary directory and starts
// postgres on a free port.
func startLocal(ctx context.Context, bin string, opts Options) (_ *localServer, _ string, err error) {
	l := &localServer{bin: bin, durable: opts.Durable, logf: opts.logf}
	if l.dir, l.cred, err = pgproc.MkdirTemp("pglease-pg-*"); err != nil {
		return nil, "", fmt.Errorf("pgserver: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(l.dir)
		}
	}()

	began := time.Now()
	major, err := binMajor(ctx, bin)
	if err != nil {
		return nil, "", err
	}
	if err := l.initCluster(ctx, major); err != nil {
		return nil, "", err
	}
	l.logf("pgserver: cluster (PostgreSQL %d) made in %s", major, time.Since(began).Round(time.Millisecond))

	if _, err := pgproc.OnFreePort(portAttempts, func(port int) error {
		l.port = port
		err := l.launch(ctx)
		if errors.Is(err, pgproc.ErrPortInUse) {
			l.logf("pgserver: port %d was taken", port)
		}
		return err
	}); err != nil {
		return nil, "", err
	}
	l.logf("pgserver: local PostgreSQL ready on 127.0.0.1:%d after %s (dir %s)",
		l.port, time.Since(began).Round(time.Millisecond), l.dir)
	dsn := l.dsn()
	return l, dsn, nil
}

// command returns a command running the server binary name as the server's
// user, with the libraries that come with the binaries in its environment.
func (l *localServer) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(l.bin, name), args...)
	pgproc.Prepare(cmd, l.dir, l.cred)
	cmd.Env = ChildEnv(l.bin, cmd.Env)
	return cmd
}

func (l *localServer) args() []string {
	args := []string{
		"-D", l.dataDir(),
		"-p", strconv.Itoa(l.port),
		"-c", "listen_addresses=127.0.0.1",
		"-c", "unix_socket_directories=",
		"-c", "max_connections=300",
		"-c", "shared_buffers=128MB",
	}
	if !l.durable {
		args = append(args, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	return args
}

// launch runs postgres on l.port and waits until it accepts connections.
// On failure no process is left; the error wraps pgproc.ErrPortInUse when
// the port was taken.
func (l *localServer) launch(ctx context.Context) error {
	cmd := l.command(context.Background(), "postgres", l.args()...) // stopped by signals, not a context
	p, err := pgproc.Launch(ctx, cmd, l.logPath(), l.dsn(), readyTimeout)
	if err != nil {
		return fmt.Errorf("pgserver: postgres on port %d did not start: %w", l.port, err)
	}
	l.proc = p
	return nil
}

func (l *localServer) stop(_ context.Context, mode Mode) error {
	p := l.proc
	if p == nil {
		return nil
	}
	l.proc = nil
	if mode == Immediate {
		// A crash: a server still there after crashTimeout is killed
		// with its children, which is a crash too (pgcluster's Crash
		// does the same, after a primary that did not exit).
		err := p.Stop(syscall.SIGQUIT, crashTimeout)
		if errors.Is(err, pgproc.ErrKilled) {
			l.logf("pgserver: postgres: %v", err)
			return nil
		}
		if err != nil {
			return fmt.Errorf("pgserver: postgres: %w", err)
		}
		return nil
	}
	if err := p.Stop(syscall.SIGINT, stopTimeout); err != nil {
		return fmt.Errorf("pgserver: postgres: %w", err)
	}
	return nil
}

// start runs postgres again on the same port, retrying for a while if the
// port is briefly unavailable.
func (l *localServer) start(ctx context.Context) (string, error) {
	if l.proc != nil {
		return l.dsn(), nil
	}
	deadline := time.Now().Add(15 * time.Second)
	for {
		err := l.launch(ctx)
		if err == nil {
			return l.dsn(), nil
		}
		if !errors.Is(err, pgproc.ErrPortInUse) || time.Now().After(deadline) {
			return "", err
		}
		l.logf("pgserver: port %d is busy, retrying", l.port)
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("pgserver: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
}

func (l *localServer) close() error {
	err := l.stop(context.Background(), Fast)
	if rmErr := os.RemoveAll(l.dir); rmErr != nil {
		err = errors.Join(err, fmt.Errorf("pgserver: %w", rmErr))
	}
	return err
}
