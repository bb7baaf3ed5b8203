package pgserver

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"

	"github.com/pglease/pglease/internal/pgproc"
)

// A cluster fresh from initdb is the same every time for the same binaries
// and arguments, and initdb costs a second or more of CPU (several under
// -race and a loaded machine), once per private server of every test. So
// the first server of given binaries keeps a copy of its fresh cluster in
// the temporary directory, named after the binaries and the arguments,
// and every later one, in this process or another, copies it (cp -a, a
// tenth of that). A copy that fails falls back to initdb.

// templateDir is where the fresh cluster of these binaries and initdb
// arguments is kept.
func templateDir(bin string, major int) string {
	args := initdbArgs(major, "")
	h := sha256.Sum256([]byte(bin + "\x00" + strconv.Itoa(major) + "\x00" + strings.Join(args, "\x00")))
	return filepath.Join(os.TempDir(), "pglease-pg-template-"+hex.EncodeToString(h[:8]))
}

// initCluster makes l's data directory a fresh cluster of major: a copy of
// the kept one when there is one, else initdb's, kept for the next server.
func (l *localServer) initCluster(ctx context.Context, major int) error {
	tmpl := templateDir(l.bin, major)
	if _, err := os.Stat(filepath.Join(tmpl, "PG_VERSION")); err == nil {
		if err := l.copyCluster(ctx, tmpl, l.dataDir()); err == nil {
			return nil
		}
		_ = os.RemoveAll(l.dataDir())
	}
	if err := pgproc.Run(l.command(ctx, "initdb", initdbArgs(major, l.dataDir())...)); err != nil {
		return fmt.Errorf("pgserver: %w", err)
	}
	l.keepTemplate(ctx, tmpl)
	return nil
}

// keepTemplate keeps a copy of l's fresh cluster as tmpl, unless another
// server kept one first: the copy is made beside it and renamed into
// place, so that a reader never sees half of one.
func (l *localServer) keepTemplate(ctx context.Context, tmpl string) {
	staging, err := os.MkdirTemp(filepath.Dir(tmpl), filepath.Base(tmpl)+".*")
	if err != nil {
		return
	}
	defer func() { _ = os.RemoveAll(staging) }()
	if err := pgproc.Chown(staging, l.cred); err != nil {
		return
	}
	copied := filepath.Join(staging, "data")
	if err := l.copyCluster(ctx, l.dataDir(), copied); err != nil {
		return
	}
	_ = os.Rename(copied, tmpl) // fails when another server kept one first
}

// copyCluster copies the cluster in from to to (which must not exist), as
// the server's user.
func (l *localServer) copyCluster(ctx context.Context, from, to string) error {
	cmd := exec.CommandContext(ctx, "cp", "-a", from, to)
	pgproc.Prepare(cmd, l.dir, l.cred)
	if err := pgproc.Run(cmd); err != nil {
		return fmt.Errorf("pgserver: copying a fresh cluster: %w", err)
	}
	return nil
}
