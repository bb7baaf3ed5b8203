package pgserver

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// Local servers: initdb and postgres from binaries found on this machine,
// in a temporary directory, postgres being a child process of ours.

const (
	readyTimeout = 60 * time.Second // for postgres to accept connections
	stopTimeout  = 30 * time.Second // for postgres to exit after a signal
	portAttempts = 3                // fresh ports tried by the first start
)

// errPortInUse marks a start that failed because the port was taken.
var errPortInUse = errors.New("port already in use")

// findBinDir finds the directory holding initdb and postgres: the one of
// either program in $PATH (symlinks resolved), then `pg_config --bindir`,
// then the newest /usr/lib/postgresql/*/bin.
func findBinDir() (string, error) {
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
	proc    *proc // nil when stopped
}

// proc is one run of postgres.
type proc struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed once cmd.Wait returned
	logOff int64         // size of the log file when this run started
}

func (l *localServer) dataDir() string { return filepath.Join(l.dir, "data") }
func (l *localServer) logPath() string { return filepath.Join(l.dir, "postgres.log") }

func (l *localServer) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", l.port)
}

// startLocal creates a cluster in a fresh temporary directory and starts
// postgres on a free port.
func startLocal(ctx context.Context, bin string, opts Options) (_ *localServer, _ string, err error) {
	dir, err := os.MkdirTemp("", "pglease-pg-*")
	if err != nil {
		return nil, "", fmt.Errorf("pgserver: %w", err)
	}
	defer func() {
		if err != nil {
			_ = os.RemoveAll(dir)
		}
	}()
	l := &localServer{bin: bin, dir: dir, durable: opts.Durable, logf: opts.logf}
	if os.Geteuid() == 0 {
		if l.cred, err = postgresUser(); err != nil {
			return nil, "", err
		}
		if err := os.Chown(dir, int(l.cred.Uid), int(l.cred.Gid)); err != nil {
			return nil, "", fmt.Errorf("pgserver: %w", err)
		}
	}

	began := time.Now()
	initdb := exec.CommandContext(ctx, filepath.Join(bin, "initdb"),
		"-D", l.dataDir(), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "-N")
	l.prepare(initdb)
	if out, err := initdb.CombinedOutput(); err != nil {
		return nil, "", fmt.Errorf("pgserver: initdb failed: %w\n%s", err, tail(out))
	}
	l.logf("pgserver: initdb done in %s", time.Since(began).Round(time.Millisecond))

	for attempt := 1; ; attempt++ {
		if l.port, err = freePort(); err != nil {
			return nil, "", err
		}
		err = l.launch(ctx)
		if err == nil {
			break
		}
		if !errors.Is(err, errPortInUse) || attempt == portAttempts {
			return nil, "", err
		}
		l.logf("pgserver: port %d was taken, trying another", l.port)
	}
	l.logf("pgserver: local PostgreSQL ready on 127.0.0.1:%d after %s (dir %s)",
		l.port, time.Since(began).Round(time.Millisecond), dir)
	dsn := l.dsn()
	return l, dsn, nil
}

// postgresUser returns the credentials of user "postgres": PostgreSQL
// refuses to run as root.
func postgresUser() (*syscall.Credential, error) {
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("pgserver: running as root, and PostgreSQL refuses to run as root, "+
			"but there is no user \"postgres\" to run it as (`apt-get install -y postgresql` or `useradd postgres` creates one): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("pgserver: user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// prepare sets the directory, environment and user of a child process.
func (l *localServer) prepare(cmd *exec.Cmd) {
	cmd.Dir = l.dir
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "LANG" || k == "LANGUAGE" || strings.HasPrefix(k, "LC_") || strings.HasPrefix(k, "PG") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+l.dir, "LC_ALL=C")
	cmd.Env = env
	// Setpgid: a signal to our process group (Ctrl-C) does not reach the
	// server; we stop it ourselves. Pdeathsig: the server dies with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: l.cred}
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
// On failure no process is left; the error wraps errPortInUse when the
// port was taken.
func (l *localServer) launch(ctx context.Context) error {
	logFile, err := os.OpenFile(l.logPath(), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	defer logFile.Close()
	fi, err := logFile.Stat()
	if err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	cmd := exec.CommandContext(context.Background(), filepath.Join(l.bin, "postgres"), l.args()...) // stopped by signals, not a context
	l.prepare(cmd)
	cmd.Stdout = logFile
	cmd.Stderr = logFile
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("pgserver: starting postgres: %w", err)
	}
	p := &proc{cmd: cmd, exited: make(chan struct{}), logOff: fi.Size()}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()

	err = waitReady(ctx, l.dsn(), p.exited, readyTimeout)
	if err == nil {
		l.proc = p
		return nil
	}
	l.kill(p)
	log := l.readLog(p.logOff)
	// LC_ALL=C keeps the message in English.
	if strings.Contains(log, "Address already in use") {
		err = fmt.Errorf("%w: %w", errPortInUse, err)
	}
	return fmt.Errorf("pgserver: postgres on port %d did not start: %w\nlog %s:\n%s", l.port, err, l.logPath(), tail([]byte(log)))
}

// kill kills the process group of p and waits for it to exit.
func (l *localServer) kill(p *proc) {
	_ = syscall.Kill(-p.cmd.Process.Pid, syscall.SIGKILL)
	<-p.exited
}

func (l *localServer) readLog(off int64) string {
	b, err := os.ReadFile(l.logPath())
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

func (l *localServer) stop(_ context.Context, mode Mode) error {
	p := l.proc
	if p == nil {
		return nil
	}
	l.proc = nil
	sig := syscall.SIGINT
	if mode == Immediate {
		sig = syscall.SIGQUIT
	}
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		l.kill(p)
		return fmt.Errorf("pgserver: signalling postgres: %w", err)
	}
	timer := time.NewTimer(stopTimeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
		l.kill(p)
		return fmt.Errorf("pgserver: postgres did not stop within %s after %v, killed it", stopTimeout, sig)
	}
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
		if !errors.Is(err, errPortInUse) || time.Now().After(deadline) {
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

// freePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func freePort() (int, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("pgserver: finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// tail returns the last lines of a log, at most about 4 KiB.
func tail(b []byte) string {
	const max = 4096
	if len(b) > max {
		b = b[len(b)-max:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
		return "...\n" + strings.TrimRight(string(b), "\n")
	}
	return strings.TrimRight(string(b), "\n")
}
