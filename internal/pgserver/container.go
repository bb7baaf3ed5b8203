package pgserver

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

// Container servers: postgres:16-alpine run by testcontainers-go.

const (
	containerImage = "postgres:16-alpine"
	dockerProbe    = 3 * time.Second
)

// logfLogger adapts Options.Logf to the testcontainers logger.
type logfLogger func(format string, args ...any)

func (f logfLogger) Printf(format string, args ...any) { f(format, args...) }

// dockerAvailable reports whether a Docker daemon answers, within
// dockerProbe. testcontainers looks for the daemon with a context of its
// own, so the probe runs in a goroutine that, on a hung daemon, may
// outlive the call; without any daemon it ends at once.
func dockerAvailable(ctx context.Context) error {
	if !dockerSocketLikely() {
		return fmt.Errorf("no DOCKER_HOST and no docker.sock")
	}
	ctx, cancel := context.WithTimeout(ctx, dockerProbe)
	defer cancel()
	result := make(chan error, 1)
	go func() {
		defer func() {
			// Some testcontainers versions panic when no daemon is found.
			if r := recover(); r != nil {
				result <- fmt.Errorf("testcontainers: %v", r)
			}
		}()
		p, err := testcontainers.NewDockerProvider(testcontainers.WithLogger(logfLogger(func(string, ...any) {})))
		if err != nil {
			result <- err
			return
		}
		result <- p.Health(ctx) // Health closes the provider
	}()
	select {
	case err := <-result:
		return err
	case <-ctx.Done():
		return ctx.Err()
	}
}

// dockerSocketLikely is a cheap look for a daemon's endpoint before asking
// testcontainers, which may take its time or panic without one.
func dockerSocketLikely() bool {
	if os.Getenv("DOCKER_HOST") != "" || os.Getenv("TESTCONTAINERS_DOCKER_SOCKET_OVERRIDE") != "" {
		return true
	}
	candidates := []string{"/var/run/docker.sock", "/run/docker.sock"}
	if home, err := os.UserHomeDir(); err == nil {
		candidates = append(candidates, filepath.Join(home, ".docker", "run", "docker.sock"), filepath.Join(home, ".docker", "desktop", "docker.sock"))
	}
	if dir := os.Getenv("XDG_RUNTIME_DIR"); dir != "" {
		candidates = append(candidates, filepath.Join(dir, "docker.sock"))
	}
	for _, c := range candidates {
		if fi, err := os.Stat(c); err == nil && fi.Mode()&os.ModeSocket != 0 {
			return true
		}
	}
	return false
}

// containerServer is a postgres container. Its port on the host may
// change when it is stopped and started again.
type containerServer struct {
	ctr  *tcpostgres.PostgresContainer
	logf func(format string, args ...any)
}

func startContainer(ctx context.Context, opts Options) (_ *containerServer, _ string, err error) {
	cmd := []string{"postgres", "-c", "max_connections=300", "-c", "shared_buffers=128MB"}
	if !opts.Durable {
		cmd = append(cmd, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	began := time.Now()
	ctr, err := tcpostgres.Run(ctx, containerImage,
		testcontainers.WithLogger(logfLogger(opts.logf)),
		testcontainers.WithCmd(cmd...),
		tcpostgres.BasicWaitStrategies(),
	)
	if err != nil {
		if ctr != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
		return nil, "", fmt.Errorf("pgserver: starting container %s: %w", containerImage, err)
	}
	c := &containerServer{ctr: ctr, logf: opts.logf}
	defer func() {
		if err != nil {
			_ = testcontainers.TerminateContainer(ctr)
		}
	}()
	dsn, err := c.waitDSN(ctx)
	if err != nil {
		return nil, "", err
	}
	opts.logf("pgserver: container %s ready at %s after %s", containerImage, Redact(dsn), time.Since(began).Round(time.Millisecond))
	return c, dsn, nil
}

// waitDSN reads the current connection string and waits until it answers.
func (c *containerServer) waitDSN(ctx context.Context) (string, error) {
	dsn, err := c.ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return "", fmt.Errorf("pgserver: container connection string: %w", err)
	}
	if err := waitReady(ctx, dsn, nil, readyTimeout); err != nil {
		return "", fmt.Errorf("pgserver: container at %s: %w", Redact(dsn), err)
	}
	return dsn, nil
}

// stop stops the container. Fast uses Docker's stop, which sends the
// image's stop signal, SIGINT. Immediate first sends SIGQUIT to the
// postmaster (PID 1 in the container), then stops the container.
func (c *containerServer) stop(ctx context.Context, mode Mode) error {
	if mode == Immediate {
		// The exec may fail as the container dies under it; Stop follows.
		if code, _, err := c.ctr.Exec(ctx, []string{"kill", "-QUIT", "1"}); err != nil || code != 0 {
			c.logf("pgserver: SIGQUIT in container: exit code %d, %v", code, err)
		}
	}
	timeout := stopTimeout
	if err := c.ctr.Stop(ctx, &timeout); err != nil {
		return fmt.Errorf("pgserver: stopping container: %w", err)
	}
	return nil
}

// start starts the container again; Docker may map another host port,
// so the returned connection string may differ from the previous one.
func (c *containerServer) start(ctx context.Context) (string, error) {
	if err := c.ctr.Start(ctx); err != nil {
		return "", fmt.Errorf("pgserver: starting container: %w", err)
	}
	return c.waitDSN(ctx)
}

func (c *containerServer) close() error {
	if err := testcontainers.TerminateContainer(c.ctr); err != nil {
		return fmt.Errorf("pgserver: removing container: %w", err)
	}
	return nil
}
