package pgserver

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/pglease/pglease/internal/pgproc"
)

// Container servers: postgres:16-alpine run by testcontainers-go. The
// Docker client is big, so it lives in a module of its own,
// internal/pgcontainer, a program run here with `go run` (and only when a
// Docker daemon answers): importers of pglease never see it in their module
// graph. Its line protocol is documented in internal/pgcontainer/main.go.

const containerImage = "postgres:16-alpine"

// containerServer is the container program and the container it runs.
// The container's port on the host may change when it is stopped and
// started again.
type containerServer struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	lines  <-chan string // the program's stdout, closed when it ends
	stderr *tailBuffer

	waitOnce sync.Once
	waitErr  error
}

// wait waits once for the program to end, and with it for its stderr to
// be copied into c.stderr.
func (c *containerServer) wait() error {
	c.waitOnce.Do(func() { c.waitErr = c.cmd.Wait() })
	return c.waitErr
}

// containerProgram returns the command that runs internal/pgcontainer from
// its source, found next to this file's.
func containerProgram(opts Options) (*exec.Cmd, error) {
	_, file, _, ok := runtime.Caller(0)
	if !ok {
		return nil, errors.New("pgserver: cannot locate the source of the container program")
	}
	dir := filepath.Join(filepath.Dir(file), "..", "pgcontainer")
	if _, err := os.Stat(filepath.Join(dir, "go.mod")); err != nil {
		return nil, fmt.Errorf("pgserver: the container program's source: %w", err)
	}
	args := []string{"run", ".", "-image", containerImage}
	if opts.Durable {
		args = append(args, "-durable")
	}
	// The program outlives the ctx of Start: it ends when its stdin closes.
	cmd := exec.CommandContext(context.Background(), "go", args...)
	cmd.Dir = dir
	// Its own go.mod and go.sum, whatever workspace surrounds it.
	cmd.Env = append(os.Environ(), "GOWORK=off")
	return cmd, nil
}

func startContainer(ctx context.Context, opts Options) (*containerServer, string, error) {
	cmd, err := containerProgram(opts)
	if err != nil {
		return nil, "", err
	}
	return runContainer(ctx, cmd, opts.logf)
}

// runContainer starts cmd, which speaks the container program's protocol,
// and returns once the server it started answers.
func runContainer(ctx context.Context, cmd *exec.Cmd, logf func(string, ...any)) (_ *containerServer, _ string, err error) {
	// A process group of its own: `go run` runs the built program as its
	// child, and a kill must reach both.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	c := &containerServer{cmd: cmd, stderr: &tailBuffer{logf: logf}}
	cmd.Stderr = c.stderr
	if c.stdin, err = cmd.StdinPipe(); err != nil {
		return nil, "", fmt.Errorf("pgserver: container program: %w", err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, "", fmt.Errorf("pgserver: container program: %w", err)
	}
	began := time.Now()
	if err := cmd.Start(); err != nil {
		return nil, "", fmt.Errorf("pgserver: starting the container program: %w", err)
	}
	lines := make(chan string)
	c.lines = lines
	go func() {
		defer close(lines)
		s := bufio.NewScanner(stdout)
		for s.Scan() {
			lines <- s.Text()
		}
	}()
	defer func() {
		if err != nil {
			_ = c.close()
		}
	}()
	dsn, err := c.dsn(ctx, "")
	if err != nil {
		return nil, "", err
	}
	logf("pgserver: container %s ready at %s after %s", containerImage, Redact(dsn), time.Since(began).Round(time.Millisecond))
	return c, dsn, nil
}

// ask sends command (none when empty) and returns the program's answer.
func (c *containerServer) ask(ctx context.Context, command string) (string, error) {
	if command != "" {
		if _, err := io.WriteString(c.stdin, command+"\n"); err != nil {
			return "", fmt.Errorf("pgserver: container program, %s: %w", command, err)
		}
	}
	select {
	case line, ok := <-c.lines:
		if !ok {
			_ = c.wait() // its stderr is copied in by then
			return "", fmt.Errorf("pgserver: the container program ended: %s", c.stderr.tail())
		}
		if msg, failed := strings.CutPrefix(line, "error "); failed {
			return "", fmt.Errorf("pgserver: container program, %s: %s", command, msg)
		}
		return line, nil
	case <-ctx.Done():
		c.kill()
		return "", fmt.Errorf("pgserver: container program, waiting for an answer to %q: %w", command, ctx.Err())
	}
}

// dsn sends command and waits for the connection string it answers to
// accept connections.
func (c *containerServer) dsn(ctx context.Context, command string) (string, error) {
	answer, err := c.ask(ctx, command)
	if err != nil {
		return "", err
	}
	dsn, ok := strings.CutPrefix(answer, "dsn ")
	if !ok {
		return "", fmt.Errorf("pgserver: container program answered %q, want a dsn", answer)
	}
	if err := pgproc.WaitReady(ctx, dsn, nil, readyTimeout); err != nil {
		return "", fmt.Errorf("pgserver: container at %s: %w", Redact(dsn), err)
	}
	return dsn, nil
}

// stop stops the container: Fast is Docker's stop (the image's stop
// signal, SIGINT); Immediate first sends SIGQUIT to the postmaster.
func (c *containerServer) stop(ctx context.Context, mode Mode) error {
	answer, err := c.ask(ctx, "stop "+string(mode))
	if err != nil {
		return err
	}
	if answer != "ok" {
		return fmt.Errorf("pgserver: container program answered %q to stop", answer)
	}
	return nil
}

// start starts the container again; Docker may map another host port,
// so the returned connection string may differ from the previous one.
func (c *containerServer) start(ctx context.Context) (string, error) {
	return c.dsn(ctx, "start")
}

// close closes the program's stdin, on which it removes the container and
// exits, and waits for it; past a timeout it kills it (Docker's reaper then
// removes the container).
func (c *containerServer) close() error {
	_ = c.stdin.Close()
	timer := time.NewTimer(stopTimeout + 30*time.Second)
	defer timer.Stop()
	killed := false
	for open := true; open; {
		select {
		case _, open = <-c.lines:
		case <-timer.C:
			c.kill()
			killed = true
		}
	}
	err := c.wait()
	switch {
	case killed:
		return errors.New("pgserver: the container program did not end in time, killed it")
	case err != nil:
		return fmt.Errorf("pgserver: removing the container: %w: %s", err, c.stderr.tail())
	}
	return nil
}

func (c *containerServer) kill() {
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
}

// tailBuffer passes the program's stderr to logf line by line and keeps
// the end of it for error messages.
type tailBuffer struct {
	logf func(string, ...any)
	mu   sync.Mutex
	buf  []byte
	part []byte // a line not yet ended
}

func (b *tailBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > 64<<10 {
		b.buf = b.buf[len(b.buf)-32<<10:]
	}
	b.part = append(b.part, p...)
	for {
		i := bytes.IndexByte(b.part, '\n')
		if i < 0 {
			break
		}
		b.logf("%s", b.part[:i])
		b.part = b.part[i+1:]
	}
	return len(p), nil
}

func (b *tailBuffer) tail() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return pgproc.Tail(b.buf)
}
