package pgserver

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgproc"
)

// fakeContainerEnv, set, makes the test binary a fake container program
// that answers with the connection string it holds: its value. The value
// "exit" makes it fail at once instead, as without a Docker image.
const fakeContainerEnv = "PGSERVER_FAKE_CONTAINER"

func fakeContainerProgram() int {
	dsn := os.Getenv(fakeContainerEnv)
	if dsn == "exit" {
		fmt.Fprintln(os.Stderr, "pgcontainer: starting container: pull access denied")
		return 1
	}
	fmt.Println("dsn " + dsn)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch in.Text() {
		case "stop fast", "stop immediate":
			fmt.Println("ok")
		case "start":
			fmt.Println("dsn " + dsn)
		default:
			fmt.Printf("error unknown command %q\n", in.Text())
		}
	}
	fmt.Fprintln(os.Stderr, "pgcontainer: stdin closed, container removed")
	return 0
}

// fakeDocker serves a Docker API that only answers GET /_ping with status,
// on a unix socket, and points DOCKER_HOST at it.
func fakeDocker(t *testing.T, status int) {
	t.Helper()
	// Not t.TempDir(): a socket path has ~100 bytes, and test names are long.
	dir, err := os.MkdirTemp("", "docker") //nolint:usetesting // see above
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	sock := filepath.Join(dir, "docker.sock")
	ln, err := (&net.ListenConfig{}).Listen(t.Context(), "unix", sock)
	require.NoError(t, err)
	srv := &http.Server{
		ReadHeaderTimeout: time.Second,
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path != "/_ping" {
				http.NotFound(w, r)
				return
			}
			w.WriteHeader(status)
			_, _ = w.Write([]byte("OK"))
		}),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = srv.Serve(ln)
	}()
	t.Cleanup(func() {
		_ = srv.Close()
		<-done
	})
	t.Setenv("DOCKER_HOST", "unix://"+sock)
}

func TestDockerProbeFindsADaemonThatAnswersPingAtDockerHost(t *testing.T) {
	fakeDocker(t, http.StatusOK)
	require.NoError(t, dockerAvailable(t.Context()))
}

func TestDockerProbeRejectsAnEndpointThatDoesNotAnswerPing(t *testing.T) {
	t.Run("error status", func(t *testing.T) {
		fakeDocker(t, http.StatusInternalServerError)
		err := dockerAvailable(t.Context())
		require.ErrorContains(t, err, "500")
	})
	t.Run("no socket", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "docker.sock"))
		require.ErrorContains(t, dockerAvailable(t.Context()), "docker.sock")
	})
	t.Run("nothing listens", func(t *testing.T) {
		port, err := pgproc.FreePort()
		require.NoError(t, err)
		t.Setenv("DOCKER_HOST", fmt.Sprintf("tcp://127.0.0.1:%d", port))
		require.Error(t, dockerAvailable(t.Context()))
	})
	t.Run("scheme not probed", func(t *testing.T) {
		t.Setenv("DOCKER_HOST", "ssh://me@host")
		require.ErrorContains(t, dockerAvailable(t.Context()), "only unix:// and tcp://")
	})
}

func TestWithoutADockerDaemonStartUsesLocalBinariesAndSaysWhyNotDocker(t *testing.T) {
	skipUnderShort(t)
	t.Setenv(EnvDatabaseURL, "")
	t.Setenv(EnvNoDocker, "")
	t.Setenv("DOCKER_HOST", "unix://"+filepath.Join(t.TempDir(), "docker.sock"))
	require.Contains(t, startOnLocalBinaries(t), "pgserver: no Docker daemon: docker at unix://")
}

// logLines collects what is logged through its logf.
type logLines struct {
	mu    sync.Mutex
	lines []string
}

func (l *logLines) logf(format string, args ...any) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

func (l *logLines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.lines...)
}

// startOnLocalBinaries starts a server, closed at cleanup, which must run on local
// binaries, and returns what it logged.
func startOnLocalBinaries(t *testing.T) string {
	t.Helper()
	var log logLines
	srv, err := Start(t.Context(), Options{Logf: log.logf})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, srv.Close()) })
	require.Equal(t, kindLocal, srv.Kind())
	return strings.Join(log.all(), "\n")
}

// fakeContainer runs the test binary as a container program answering dsn.
func fakeContainer(dsn string) *exec.Cmd {
	cmd := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fakeContainerEnv+"="+dsn)
	return cmd
}

func TestContainerServerSpeaksTheContainerProgramsProtocol(t *testing.T) {
	skipUnderShort(t)
	t.Setenv(EnvDatabaseURL, "")
	local, err := Start(t.Context(), Options{Private: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, local.Close()) }()

	var log logLines
	c, dsn, err := runContainer(t.Context(), fakeContainer(local.DSN()), log.logf)
	require.NoError(t, err)
	require.Equal(t, local.DSN(), dsn)
	require.NoError(t, c.stop(t.Context(), Immediate))
	require.NoError(t, c.stop(t.Context(), Fast))
	dsn, err = c.start(t.Context())
	require.NoError(t, err)
	require.Equal(t, local.DSN(), dsn)
	require.ErrorContains(t, c.stop(t.Context(), "sideways"), `unknown command "stop sideways"`)
	require.NoError(t, c.close(), "closing stdin ends the program")
	require.Contains(t, log.all(), "pgcontainer: stdin closed, container removed", "stderr goes to Logf")
}

func TestContainerProgramThatEndsEarlyIsAnErrorCarryingItsStderr(t *testing.T) {
	_, _, err := runContainer(t.Context(), fakeContainer("exit"), func(string, ...any) {})
	require.ErrorContains(t, err, "pull access denied")
}

func TestContainerProgramBuildsFromItsOwnModule(t *testing.T) {
	skipUnderShort(t)
	cmd, err := containerProgram(Options{Durable: true})
	require.NoError(t, err)
	require.Equal(t, []string{"go", "run", ".", "-image", containerImage, "-durable"}, cmd.Args)
	require.FileExists(t, filepath.Join(cmd.Dir, "go.mod"))
	build := exec.CommandContext(t.Context(), "go", "build", "-o", os.DevNull, ".")
	build.Dir, build.Env = cmd.Dir, cmd.Env
	out, err := build.CombinedOutput()
	require.NoError(t, err, "%s", out)
}

func TestDockerDaemonThatRunsNoContainerFallsBackToLocalBinaries(t *testing.T) {
	skipUnderShort(t)
	t.Setenv(EnvDatabaseURL, "")
	t.Setenv(EnvNoDocker, "")
	fakeDocker(t, http.StatusOK) // answers the probe, and nothing else
	require.Contains(t, startOnLocalBinaries(t), "pgserver: no container: pgserver: the container program ended")
}
