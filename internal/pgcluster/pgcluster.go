// Package pgcluster runs a real PostgreSQL primary and a streaming standby
// from the local server binaries, so that tests can crash the primary,
// promote the standby and measure what survives, as a Patroni or a managed
// service would fail over.
//
// Both servers run on 127.0.0.1, each on a port of its own that it keeps for
// the life of the Cluster, as the "postgres" user when running as root
// (internal/pgserver finds the binaries and the user). They are durable:
// fsync, full_page_writes and synchronous_commit stay on, since the tests
// that use them test durability. The standby is made with pg_basebackup
// (streaming replication, standby.signal and primary_conninfo written by
// -R); in Synchronous mode the primary has synchronous_standby_names = '*',
// so a commit waits until the standby has flushed it.
//
// The standby's replication connection goes through a TCP proxy
// (internal/faultproxy) of the Cluster's, so that Partition can cut the
// stream while both servers run, as a network partition does: the primary
// sends WAL that never arrives, and the standby answers nothing.
//
// Clients reach whichever server is primary through DSN, a multi-host
// connection string with target_session_attrs=read-write, as applications
// do: pgx tries both hosts and keeps the one that accepts writes.
//
// There is no Docker path and no PGLEASE_DATABASE_URL path: a failover needs
// servers of our own. Missing binaries are an error, never a skip.
package pgcluster

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgproc"
	"github.com/pglease/pglease/internal/pgserver"
)

const (
	readyTimeout = 60 * time.Second // for a server to accept connections
	stopTimeout  = 30 * time.Second // for a server to exit after a signal
	// crashTimeout is how long Crash waits for the primary to exit after
	// SIGQUIT before it kills the server and its children: a primary
	// partitioned from its synchronous standby was once still there 30 s
	// after SIGQUIT (which child held it, Stop's error now says).
	crashTimeout = 10 * time.Second
)

// Options configures a Cluster.
type Options struct {
	// Synchronous makes the standby synchronous: synchronous_standby_names
	// = '*' and synchronous_commit = on, so that a commit is acknowledged
	// only once the standby has flushed it. Otherwise the standby is
	// asynchronous and a crash can lose what it had not yet received.
	Synchronous bool
	// Logf receives progress messages; nil means silent.
	Logf func(format string, args ...any)
}

// Cluster is a primary and a standby. Its methods are safe for concurrent
// use, and serialized.
type Cluster struct {
	bin  string
	cred *syscall.Credential
	root string
	opts Options

	mu      sync.Mutex
	nodes   [2]*node
	primary int               // index in nodes of the primary
	link    *faultproxy.Proxy // the standby's replication connection goes through it
	closed  bool
}

// node is one server: a data directory and a port that outlive its runs.
type node struct {
	name string
	dir  string // holds data/ and postgres.log
	port int
	proc *pgproc.Proc // nil when not running
}

func (n *node) dataDir() string { return filepath.Join(n.dir, "data") }
func (n *node) logPath() string { return filepath.Join(n.dir, "postgres.log") }

func (n *node) dsn() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d/postgres?sslmode=disable", n.port)
}

// Start creates a primary and a standby and waits until the standby streams
// from the primary (and, when synchronous, is its synchronous standby).
func Start(ctx context.Context, opts Options) (_ *Cluster, err error) {
	bin, err := pgserver.BinDir()
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w (install them: `apt-get install -y postgresql`)", err)
	}
	for _, name := range []string{"pg_basebackup", "pg_ctl"} {
		if _, err := os.Stat(filepath.Join(bin, name)); err != nil {
			return nil, fmt.Errorf("pgcluster: %s not found beside initdb in %s: %w", name, bin, err)
		}
	}
	root, cred, err := pgproc.MkdirTemp("pglease-cluster-*")
	if err != nil {
		return nil, fmt.Errorf("pgcluster: %w", err)
	}
	c := &Cluster{bin: bin, cred: cred, root: root, opts: opts}
	defer func() {
		if err != nil {
			_ = c.Close()
		}
	}()
	for i := range c.nodes {
		port, err := pgproc.FreePort()
		if err != nil {
			return nil, fmt.Errorf("pgcluster: %w", err)
		}
		c.nodes[i] = &node{name: fmt.Sprintf("node%d", i), dir: filepath.Join(root, fmt.Sprintf("node%d", i)), port: port}
		if err := c.mkdir(c.nodes[i].dir); err != nil {
			return nil, err
		}
	}

	primary := c.nodes[0]
	if err := c.run(ctx, "initdb", "-D", primary.dataDir(), "-U", "postgres", "--auth=trust", "--no-locale", "-E", "UTF8"); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(primary.dataDir(), "postgresql.conf"), c.config()); err != nil {
		return nil, err
	}
	if err := appendFile(filepath.Join(primary.dataDir(), "pg_hba.conf"),
		"host all all 127.0.0.1/32 trust\nhost replication all 127.0.0.1/32 trust\n"); err != nil {
		return nil, err
	}
	if err := c.launch(ctx, primary); err != nil {
		return nil, err
	}
	if err := c.makeStandby(ctx, c.nodes[1], primary); err != nil {
		return nil, err
	}
	c.logf("pgcluster: primary %s on port %d, %s standby %s on port %d", primary.name, primary.port,
		c.mode(), c.nodes[1].name, c.nodes[1].port)
	return c, nil
}

func (c *Cluster) mode() string {
	if c.opts.Synchronous {
		return "synchronous"
	}
	return "asynchronous"
}

// config is appended to the primary's postgresql.conf; pg_basebackup copies
// it to every standby, so that either can be promoted and keep the same
// settings.
func (c *Cluster) config() string {
	names := "''"
	if c.opts.Synchronous {
		names = "'*'"
	}
	return strings.Join([]string{
		"",
		"# pgcluster",
		"listen_addresses = '127.0.0.1'",
		"unix_socket_directories = ''",
		"max_connections = 200",
		"shared_buffers = 32MB",
		"fsync = on",
		"full_page_writes = on",
		"synchronous_commit = on",
		"synchronous_standby_names = " + names,
		"wal_level = replica",
		"max_wal_senders = 8",
		"wal_keep_size = '256MB'",
		"hot_standby = on",
		"wal_receiver_status_interval = '1s'",
		"",
	}, "\n")
}

// DSN is the multi-host connection string that reaches whichever server is
// primary: pgx tries both, and target_session_attrs=read-write keeps the
// one that accepts writes. It never changes.
func (c *Cluster) DSN() string {
	return fmt.Sprintf("postgres://postgres@127.0.0.1:%d,127.0.0.1:%d/postgres?sslmode=disable&target_session_attrs=read-write&connect_timeout=2",
		c.nodes[0].port, c.nodes[1].port)
}

// PrimaryDSN is the connection string of the current primary alone.
func (c *Cluster) PrimaryDSN() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[c.primary].dsn()
}

// StandbyDSN is the connection string of the current standby alone.
func (c *Cluster) StandbyDSN() string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.nodes[1-c.primary].dsn()
}

// Crash stops the primary without a checkpoint and without waiting for
// anything (pg_ctl's -m immediate: SIGQUIT to the postmaster) and returns
// once its process has exited: from then on nothing commits there. A
// server still there after crashTimeout is killed with its children, which
// is a crash too: Crash logs it and returns nil.
func (c *Cluster) Crash() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.nodes[c.primary]
	err := c.stop(n, syscall.SIGQUIT, crashTimeout)
	if errors.Is(err, pgproc.ErrKilled) {
		c.logf("%v", err)
		return nil
	}
	return err
}

// Promote promotes the standby (pg_ctl promote, waiting until it accepts
// writes); it becomes the primary. In synchronous mode its commits then wait
// for a standby again: call Rebuild.
func (c *Cluster) Promote(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	standby := c.nodes[1-c.primary]
	if err := c.run(ctx, "pg_ctl", "promote", "-D", standby.dataDir(), "-w", "-t", "60"); err != nil {
		return err
	}
	c.primary = 1 - c.primary
	return nil
}

// Rebuild replaces the old primary, which must be stopped, with a fresh
// standby of the new one, on the same port: its data directory is removed
// and copied again with pg_basebackup. It returns once the standby streams
// (and, when synchronous, is the synchronous standby), so that commits on
// the primary proceed.
func (c *Cluster) Rebuild(ctx context.Context) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	old := c.nodes[1-c.primary]
	if old.proc != nil {
		return fmt.Errorf("pgcluster: %s is still running; Crash it before Rebuild", old.name)
	}
	if err := os.RemoveAll(old.dataDir()); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return c.makeStandby(ctx, old, c.nodes[c.primary])
}

// Failover crashes the primary, promotes the standby and rebuilds the old
// primary as the new standby. It returns when the crash was done, and how
// long the promotion and the rebuild took.
type Failover struct {
	Crashed  time.Time     // the old primary's process had exited
	Promoted time.Duration // from Crashed until the new primary accepted writes
	Rebuilt  time.Duration // from Crashed until the new standby streamed
}

// Fail runs Crash, Promote and Rebuild, with the timings of each.
func (c *Cluster) Fail(ctx context.Context) (Failover, error) {
	var f Failover
	if err := c.Crash(); err != nil {
		return f, err
	}
	f.Crashed = time.Now()
	if err := c.Promote(ctx); err != nil {
		return f, err
	}
	f.Promoted = time.Since(f.Crashed)
	if err := c.Rebuild(ctx); err != nil {
		return f, err
	}
	f.Rebuilt = time.Since(f.Crashed)
	return f, nil
}

// Partition cuts the standby's replication stream: what the primary sends
// is dropped and the standby's replies never arrive, while both servers run
// and the connection stays open. A synchronous standby then confirms no
// commit: commits on the primary wait for it. Heal ends the partition.
func (c *Cluster) Partition() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.link.SetMode(faultproxy.Blackhole)
}

// Heal ends a Partition: the cut connection is reset, and the standby
// connects again and catches up.
func (c *Cluster) Heal() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.link.SetMode(faultproxy.Forward)
}

// Close stops both servers and removes their directories.
func (c *Cluster) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return nil
	}
	c.closed = true
	if c.link != nil {
		c.link.Close()
	}
	var errs []error
	for _, n := range c.nodes {
		if n != nil {
			errs = append(errs, c.stop(n, syscall.SIGINT, stopTimeout))
		}
	}
	if err := os.RemoveAll(c.root); err != nil {
		errs = append(errs, fmt.Errorf("pgcluster: %w", err))
	}
	return errors.Join(errs...)
}

// makeStandby copies primary into n with pg_basebackup -R (standby.signal
// and primary_conninfo) and starts it. The copy is taken through a new
// proxy to primary, replacing the previous standby's, so that the
// primary_conninfo it writes names the proxy.
func (c *Cluster) makeStandby(ctx context.Context, n, primary *node) error {
	began := time.Now()
	link, err := faultproxy.New(fmt.Sprintf("127.0.0.1:%d", primary.port))
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if c.link != nil {
		c.link.Close()
	}
	c.link = link
	if err := c.run(ctx, "pg_basebackup", "-h", "127.0.0.1", "-p", strconv.Itoa(int(link.Port())), "-U", "postgres",
		"-D", n.dataDir(), "-X", "stream", "-R", "-c", "fast"); err != nil {
		return err
	}
	if err := c.launch(ctx, n); err != nil {
		return err
	}
	if err := c.waitStreaming(ctx, primary); err != nil {
		return err
	}
	c.logf("pgcluster: %s streams from %s after %s", n.name, primary.name, time.Since(began).Round(time.Millisecond))
	return nil
}

// streamingSQL counts standbys that stream, and are synchronous when $1.
const streamingSQL = `SELECT count(*) FROM pg_stat_replication
 WHERE state = 'streaming' AND (sync_state = 'sync' OR NOT $1)`

func (c *Cluster) waitStreaming(ctx context.Context, primary *node) error {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	var last error
	for {
		conn, err := pgx.Connect(ctx, primary.dsn())
		if err == nil {
			var n int
			err = conn.QueryRow(ctx, streamingSQL, c.opts.Synchronous).Scan(&n)
			_ = conn.Close(context.Background())
			if err == nil && n > 0 {
				return nil
			}
			if err == nil {
				err = errors.New("no standby streams yet")
			}
		}
		last = err
		select {
		case <-ctx.Done():
			return fmt.Errorf("pgcluster: standby of %s not streaming after %s: %w", primary.name, readyTimeout, last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// launch runs postgres on n's data directory and port and waits until it
// accepts connections (a hot standby accepts read-only ones).
func (c *Cluster) launch(ctx context.Context, n *node) error {
	cmd := c.command(context.Background(), "postgres", "-D", n.dataDir(), "-p", strconv.Itoa(n.port)) // stopped by signals, not a context
	p, err := pgproc.Launch(ctx, cmd, n.logPath(), n.dsn(), readyTimeout)
	if err != nil {
		return fmt.Errorf("pgcluster: %s on port %d did not start: %w", n.name, n.port, err)
	}
	n.proc = p
	return nil
}

// stop signals n's postmaster (SIGINT: fast, SIGQUIT: immediate) and waits
// for it to exit, killing it after timeout.
func (c *Cluster) stop(n *node, sig syscall.Signal, timeout time.Duration) error {
	p := n.proc
	if p == nil {
		return nil
	}
	n.proc = nil
	if err := p.Stop(sig, timeout); err != nil {
		return fmt.Errorf("pgcluster: %s: %w", n.name, err)
	}
	return nil
}

// run runs one of the server binaries as the server's user, to its end.
func (c *Cluster) run(ctx context.Context, name string, args ...string) error {
	if err := pgproc.Run(c.command(ctx, name, args...)); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

// command returns a command running the server binary name as the server's
// user.
func (c *Cluster) command(ctx context.Context, name string, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, filepath.Join(c.bin, name), args...)
	pgproc.Prepare(cmd, c.root, c.cred)
	return cmd
}

// mkdir creates dir owned by the server's user.
func (c *Cluster) mkdir(dir string) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	if err := pgproc.Chown(dir, c.cred); err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}

func (c *Cluster) logf(format string, args ...any) {
	if c.opts.Logf != nil {
		c.opts.Logf(format, args...)
	}
}

func appendFile(path, text string) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	_, err = f.WriteString(text)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("pgcluster: %w", err)
	}
	return nil
}
