package pgproc

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestTail(t *testing.T) {
	require.Equal(t, "a\nb", Tail([]byte("a\nb\n")))
	long := strings.Repeat("line\n", 2000) + "last"
	got := Tail([]byte(long))
	require.True(t, strings.HasPrefix(got, "...\nline"))
	require.True(t, strings.HasSuffix(got, "\nlast"))
	require.Less(t, len(got), 4200)
}

// A process that ignores the signal is killed at the timeout, with its
// children that made a session of their own (as PostgreSQL's do), which a
// signal to its process group does not reach.
func TestStopKillsAfterItsTimeout(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), "sh", "-c", `trap "" QUIT; setsid sleep 300 & while :; do sleep 0.05; done`)
	Prepare(cmd, t.TempDir(), nil)
	p, err := start(cmd, filepath.Join(t.TempDir(), "log"), 0)
	require.NoError(t, err)
	var sleeper int
	require.Eventually(t, func() bool {
		for _, c := range children(cmd.Process.Pid) {
			if c.comm == "sleep" && c.state != "Z" {
				if out, err := os.ReadFile("/proc/" + strconv.Itoa(c.pid) + "/cmdline"); err == nil && strings.Contains(string(out), "300") {
					sleeper = c.pid
					return true
				}
			}
		}
		return false
	}, 5*time.Second, 10*time.Millisecond, "the child in its own session started")

	err = p.Stop(syscall.SIGQUIT, 200*time.Millisecond)
	require.ErrorIs(t, err, ErrKilled)
	require.Contains(t, err.Error(), strconv.Itoa(sleeper)+" sleep", "the error names the children left")
	require.Eventually(t, func() bool {
		stat, err := os.ReadFile("/proc/" + strconv.Itoa(sleeper) + "/stat")
		return err != nil || strings.Contains(string(stat), ") Z ")
	}, 5*time.Second, 10*time.Millisecond, "the child in its own session is killed too")
}

// A process that exits on the signal is no error.
func TestStopWithinItsTimeout(t *testing.T) {
	cmd := exec.CommandContext(t.Context(), "sleep", "300")
	Prepare(cmd, t.TempDir(), nil)
	p, err := start(cmd, filepath.Join(t.TempDir(), "log"), 0)
	require.NoError(t, err)
	require.NoError(t, p.Stop(syscall.SIGQUIT, 5*time.Second))
}
