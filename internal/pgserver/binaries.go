package pgserver

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
)

// EnvBinDir names the environment variable holding the directory of the
// server binaries (initdb, postgres) to run when a local server is started,
// instead of the ones found in $PATH or /usr/lib/postgresql: it chooses the
// major a test run gets, as with `PGLEASE_PG_BINDIR=$(.ci/pgmajors 18)`. It
// does not change the order of preference: PGLEASE_DATABASE_URL and Docker
// still come first.
const EnvBinDir = "PGLEASE_PG_BINDIR"

// BinDir returns the directory of the local PostgreSQL server binaries
// (initdb, postgres, pg_ctl, pg_basebackup), found as Start finds them.
// It is for harnesses that run servers of their own, such as a primary and
// a standby; run them with ChildEnv.
func BinDir() (string, error) { return findBinDir() }

// ChildEnv returns env, the environment of a program of bin, with the
// libraries that come with those binaries first in LD_LIBRARY_PATH: a
// server unpacked from a package (.ci/pgmajors) carries its own in
// bin/../lib. That package's programs also find them through their RUNPATH;
// a build without one finds them only so. env is returned as is
// for binaries without libraries of their own beside them, such as a
// distribution's. env is not modified.
func ChildEnv(bin string, env []string) []string {
	lib := filepath.Join(filepath.Dir(bin), "lib")
	if own, _ := filepath.Glob(filepath.Join(lib, "lib*.so.*")); len(own) == 0 {
		return env
	}
	out := make([]string, 0, len(env)+1)
	path := lib
	for _, kv := range env {
		if v, ok := strings.CutPrefix(kv, "LD_LIBRARY_PATH="); ok {
			if v != "" {
				path = lib + ":" + v
			}
			continue
		}
		out = append(out, kv)
	}
	return append(out, "LD_LIBRARY_PATH="+path)
}

// versionOutput matches what `initdb --version` prints: "initdb
// (PostgreSQL) 18.4", "initdb (PostgreSQL) 14.23" or "... 19beta1".
var versionOutput = regexp.MustCompile(`\(PostgreSQL\) (\d+)`)

// binMajor returns the major of the server binaries in bin, as `initdb
// --version` tells.
func binMajor(ctx context.Context, bin string) (int, error) {
	cmd := exec.CommandContext(ctx, filepath.Join(bin, "initdb"), "--version")
	cmd.Env = ChildEnv(bin, os.Environ())
	out, err := cmd.Output()
	if err != nil {
		return 0, fmt.Errorf("pgserver: %s --version: %w", cmd.Path, err)
	}
	return parseMajor(string(out))
}

func parseMajor(versionLine string) (int, error) {
	m := versionOutput.FindStringSubmatch(versionLine)
	if m == nil {
		return 0, fmt.Errorf("pgserver: no PostgreSQL version in %q", strings.TrimSpace(versionLine))
	}
	return strconv.Atoi(m[1])
}

// initdbArgs returns the arguments of initdb for a cluster in dataDir made
// by binaries of major: every major gets the same cluster, so that a test
// measures the same thing on each. PostgreSQL 18 turned data checksums on
// by default; they stay off, as on the majors before it, since with them
// a read that sets hint bits may write a full page image to the WAL
// (wal_log_hints in effect), which the WAL measures of the tests would
// count.
func initdbArgs(major int, dataDir string) []string {
	args := []string{"-D", dataDir, "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8", "-N"}
	if major >= 18 {
		args = append(args, "--no-data-checksums")
	}
	return args
}
