// Package pgproc runs the server programs of the test harnesses (postgres
// for internal/pgserver and internal/pgcluster, pgbouncer for
// internal/pgbouncer) as child processes of ours, the same way everywhere:
//
//   - as the "postgres" user when running as root, since PostgreSQL and
//     PgBouncer refuse to run as root, in directories that user owns
//     (MkdirTemp, Chown);
//   - with an environment of their own: no PG* variables of ours, HOME in
//     their directory, LC_ALL=C so that messages are in English (Prepare);
//   - in a process group of their own, so that Ctrl-C reaches us and not
//     them (we stop them ourselves), and killed when we die (Prepare);
//   - on a port of 127.0.0.1 that was free a moment ago, tried again on
//     another when it was taken meanwhile (FreePort, OnFreePort);
//   - ready once a query goes through, stopped by a signal and killed if
//     they do not exit in time (Launch, Proc.Stop).
package pgproc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// ErrPortInUse marks a launch that failed because the port was taken.
var ErrPortInUse = errors.New("port already in use")

// ErrKilled marks a Stop that ran out of time and killed the process.
var ErrKilled = errors.New("killed it")

// credential returns the credentials to run server programs as: the
// "postgres" user when running as root, and nil (the current user)
// otherwise.
func credential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	u, err := user.Lookup("postgres")
	if err != nil {
		return nil, fmt.Errorf("running as root, which PostgreSQL and PgBouncer refuse, "+
			"but there is no user \"postgres\" to run them as (`apt-get install -y postgresql` or `useradd postgres` creates one): %w", err)
	}
	uid, err1 := strconv.ParseUint(u.Uid, 10, 32)
	gid, err2 := strconv.ParseUint(u.Gid, 10, 32)
	if err := errors.Join(err1, err2); err != nil {
		return nil, fmt.Errorf("user postgres: %w", err)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// Chown gives path to the user of cred; nothing when cred is nil.
func Chown(path string, cred *syscall.Credential) error {
	if cred == nil {
		return nil
	}
	return os.Chown(path, int(cred.Uid), int(cred.Gid))
}

// MkdirTemp creates a temporary directory, as os.MkdirTemp does, for
// server programs: owned by the user they run as, whose credentials it
// returns for Prepare and Chown.
func MkdirTemp(pattern string) (string, *syscall.Credential, error) {
	cred, err := credential()
	if err != nil {
		return "", nil, err
	}
	dir, err := os.MkdirTemp("", pattern)
	if err != nil {
		return "", nil, err
	}
	if err := Chown(dir, cred); err != nil {
		_ = os.RemoveAll(dir)
		return "", nil, err
	}
	return dir, cred, nil
}

// Prepare sets the directory, environment and user of a child process:
// it runs in dir, which is also its HOME, as the user of cred (nil: ours).
func Prepare(cmd *exec.Cmd, dir string, cred *syscall.Credential) {
	cmd.Dir = dir
	var env []string
	for _, kv := range os.Environ() {
		k, _, _ := strings.Cut(kv, "=")
		if k == "HOME" || k == "LANG" || k == "LANGUAGE" || strings.HasPrefix(k, "LC_") || strings.HasPrefix(k, "PG") {
			continue
		}
		env = append(env, kv)
	}
	env = append(env, "HOME="+dir, "LC_ALL=C")
	cmd.Env = env
	// Setpgid: a signal to our process group (Ctrl-C) does not reach the
	// server; we stop it ourselves. Pdeathsig: the server dies with us.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL, Credential: cred}
}

// Run runs cmd to its end; the error names the command and ends with the
// tail of its output.
func Run(cmd *exec.Cmd) error {
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("%s: %w\n%s", strings.Join(cmd.Args, " "), err, Tail(out))
	}
	return nil
}

// FreePort returns a TCP port of 127.0.0.1 that was free a moment ago.
func FreePort() (int, error) {
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("finding a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// OnFreePort calls launch with a free port until it succeeds, fails for
// another reason than ErrPortInUse (someone took the port between FreePort
// and the launch), or has tried attempts ports. It returns the port of the
// last attempt.
func OnFreePort(attempts int, launch func(port int) error) (int, error) {
	for attempt := 1; ; attempt++ {
		port, err := FreePort()
		if err != nil {
			return 0, err
		}
		err = launch(port)
		if err == nil || !errors.Is(err, ErrPortInUse) || attempt == attempts {
			return port, err
		}
	}
}

// Proc is one run of a server program.
type Proc struct {
	cmd     *exec.Cmd
	exited  chan struct{} // closed once cmd.Wait returned
	logPath string
	logOff  int64 // size of the log file when this run started
}

// Launch starts cmd with its output appended to the file at logPath and
// waits until a query goes through dsn. On failure no process is left, and
// the error ends with what this run wrote to the log; it wraps ErrPortInUse
// when the log says the port was taken.
func Launch(ctx context.Context, cmd *exec.Cmd, logPath, dsn string, timeout time.Duration) (*Proc, error) {
	logFile, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	fi, err := logFile.Stat()
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = logFile, logFile
	p, err := start(cmd, logPath, fi.Size())
	if err != nil {
		return nil, err
	}
	err = WaitReady(ctx, dsn, p.exited, timeout)
	if err == nil {
		return p, nil
	}
	p.Kill()
	log := ReadLog(logPath, p.logOff)
	// LC_ALL=C (Prepare) keeps the message in English.
	if strings.Contains(log, "Address already in use") {
		err = fmt.Errorf("%w: %w", ErrPortInUse, err)
	}
	return nil, fmt.Errorf("%w\nlog %s:\n%s", err, logPath, Tail([]byte(log)))
}

// start starts cmd, whose output goes to the log at logPath from logOff
// on, and waits for its exit in the background.
func start(cmd *exec.Cmd, logPath string, logOff int64) (*Proc, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	p := &Proc{cmd: cmd, exited: make(chan struct{}), logPath: logPath, logOff: logOff}
	go func() {
		_ = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// Kill kills the process group of p, and each child of p with its own
// group (PostgreSQL's children call setsid), and waits for p to exit.
func (p *Proc) Kill() {
	pid := p.cmd.Process.Pid
	for _, c := range children(pid) {
		_ = syscall.Kill(-c.pid, syscall.SIGKILL)
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
	}
	_ = syscall.Kill(-pid, syscall.SIGKILL)
	<-p.exited
}

// child is a process whose parent is a Proc's.
type child struct {
	pid   int
	state string // as /proc/PID/stat has it: R, S, D, Z, ...
	comm  string
	wchan string // the kernel function it sleeps in, if any
}

func (c child) String() string {
	return fmt.Sprintf("%d %s %s %s", c.pid, c.comm, c.state, c.wchan)
}

// children lists the processes whose parent is pid, from /proc: a
// server's children, which a signal to its group does not reach.
func children(pid int) []child {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	var out []child
	for _, e := range entries {
		n, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		stat, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		// pid (comm) state ppid ...: comm may hold spaces and parentheses.
		open, end := strings.IndexByte(string(stat), '('), strings.LastIndexByte(string(stat), ')')
		if open < 0 || end < open {
			continue
		}
		fields := strings.Fields(string(stat[end+1:]))
		if len(fields) < 2 || fields[1] != strconv.Itoa(pid) {
			continue
		}
		wchan, _ := os.ReadFile("/proc/" + e.Name() + "/wchan")
		out = append(out, child{pid: n, state: fields[0], comm: string(stat[open+1 : end]), wchan: string(wchan)})
	}
	return out
}

// Stop sends sig to p and waits for it to exit, killing its process group
// when the signal cannot be sent or after timeout. A process that had
// already exited is no error: its log may say why.
func (p *Proc) Stop(sig syscall.Signal, timeout time.Duration) error {
	if err := p.cmd.Process.Signal(sig); err != nil && !errors.Is(err, os.ErrProcessDone) {
		p.Kill()
		return fmt.Errorf("signalling: %w", err)
	}
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	select {
	case <-p.exited:
		return nil
	case <-timer.C:
		left := children(p.cmd.Process.Pid)
		p.Kill()
		return fmt.Errorf("did not stop within %s after %v: %w (its children then, pid comm state wchan: %v)\nlog %s:\n%s",
			timeout, sig, ErrKilled, left, p.logPath, Tail([]byte(ReadLog(p.logPath, p.logOff))))
	}
}

// ReadLog returns the log file at path from offset off on; "" when it
// cannot be read.
func ReadLog(path string, off int64) string {
	b, err := os.ReadFile(path)
	if err != nil || off > int64(len(b)) {
		return ""
	}
	return string(b[off:])
}

// Ping connects to dsn and runs SELECT 1, within timeout. It uses the
// simple protocol, which also goes through PgBouncer in transaction mode.
func Ping(ctx context.Context, dsn string, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.DefaultQueryExecMode = pgx.QueryExecModeSimpleProtocol
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer conn.Close(context.Background())
	var one int
	return conn.QueryRow(ctx, "SELECT 1").Scan(&one)
}

// WaitReady pings dsn until it answers, exited is closed (the server
// process died; nil when there is no process of ours), ctx ends or timeout
// passes. It returns the last error.
func WaitReady(ctx context.Context, dsn string, exited <-chan struct{}, timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		select {
		case <-exited:
			return errors.New("server process exited")
		default:
		}
		last := Ping(ctx, dsn, 2*time.Second)
		if last == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("server process exited: %w", last)
		case <-ctx.Done():
			return fmt.Errorf("not ready after %s: %w", timeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// Tail returns the last lines of a log, at most about 4 KiB.
func Tail(b []byte) string {
	const limit = 4096
	if len(b) > limit {
		b = b[len(b)-limit:]
		if i := strings.IndexByte(string(b), '\n'); i >= 0 {
			b = b[i+1:]
		}
		return "...\n" + strings.TrimRight(string(b), "\n")
	}
	return strings.TrimRight(string(b), "\n")
}
