package pgserver

import (
	"context"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/pgproc"
)

// TestMain proves that no goroutine (the one waiting on a postgres child,
// pgx's, the Docker probe's, the container program's reader) survives the
// tests. Run with fakeContainerEnv set, the test binary is instead a fake
// container program (container_test.go).
func TestMain(m *testing.M) {
	if os.Getenv(fakeContainerEnv) != "" {
		os.Exit(fakeContainerProgram())
	}
	goleak.VerifyTestMain(m)
}

func connect(t *testing.T, dsn string) *pgx.Conn {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

func countRows(t *testing.T, dsn string) int {
	t.Helper()
	conn := connect(t, dsn)
	var n int
	require.NoError(t, conn.QueryRow(context.Background(), "SELECT count(*) FROM survivors").Scan(&n))
	require.NoError(t, conn.Close(context.Background()))
	return n
}

func TestServerLifecycle(t *testing.T) {
	skipUnderShort(t)
	t.Setenv(EnvDatabaseURL, "")
	ctx := context.Background()

	began := time.Now()
	srv, err := Start(ctx, Options{Logf: t.Logf})
	require.NoError(t, err)
	t.Logf("%s server started in %s at %s", srv.Kind(), time.Since(began).Round(time.Millisecond), Redact(srv.DSN()))
	t.Cleanup(func() { _ = srv.Close() })
	require.True(t, srv.CanRestart())
	require.Contains(t, []string{kindContainer, kindLocal}, srv.Kind())

	var dir string
	if l, ok := srv.be.(*localServer); ok {
		dir = l.dir
		require.DirExists(t, dir)
	}

	conn := connect(t, srv.DSN())
	var version string
	require.NoError(t, conn.QueryRow(ctx, "SELECT version()").Scan(&version))
	require.Contains(t, version, "PostgreSQL")
	var fsync string
	require.NoError(t, conn.QueryRow(ctx, "SHOW fsync").Scan(&fsync))
	require.Equal(t, "off", fsync)
	_, err = conn.Exec(ctx, "CREATE TABLE survivors (id int PRIMARY KEY)")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO survivors VALUES (1)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	dsn := srv.DSN()
	began = time.Now()
	require.NoError(t, srv.Restart(ctx, Fast))
	t.Logf("Restart(Fast) took %s", time.Since(began).Round(time.Millisecond))
	if srv.Kind() == kindLocal {
		require.Equal(t, dsn, srv.DSN(), "a local server keeps its port")
	}
	require.Equal(t, 1, countRows(t, srv.DSN()))

	// A row committed durably (to the kernel: fsync is off) just before an
	// immediate stop must come back through crash recovery.
	conn = connect(t, srv.DSN())
	_, err = conn.Exec(ctx, "SET synchronous_commit = on")
	require.NoError(t, err)
	_, err = conn.Exec(ctx, "INSERT INTO survivors VALUES (2)")
	require.NoError(t, err)
	require.NoError(t, conn.Close(ctx))

	// DSN may be called while a restart is under way.
	var wg sync.WaitGroup
	done := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
				if srv.DSN() == "" {
					t.Error("empty DSN during restart")
					return
				}
				time.Sleep(time.Millisecond)
			}
		}
	}()
	began = time.Now()
	err = srv.Restart(ctx, Immediate)
	close(done)
	wg.Wait()
	require.NoError(t, err)
	t.Logf("Restart(Immediate) took %s", time.Since(began).Round(time.Millisecond))
	require.Equal(t, 2, countRows(t, srv.DSN()))
	if l, ok := srv.be.(*localServer); ok {
		require.Contains(t, pgproc.ReadLog(l.logPath(), 0), "automatic recovery in progress", "Immediate leads to crash recovery")
	}

	require.NoError(t, srv.Stop(Fast))
	require.NoError(t, srv.Stop(Fast), "stopping a stopped server does nothing")
	require.Error(t, pgproc.Ping(ctx, srv.DSN(), 2*time.Second))

	if l, ok := srv.be.(*localServer); ok {
		// Start waits while the port is briefly taken by someone else.
		ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:"+strconv.Itoa(l.port))
		require.NoError(t, err)
		release := time.AfterFunc(time.Second, func() { _ = ln.Close() })
		defer release.Stop()
	}
	require.NoError(t, srv.Start(ctx))
	require.NoError(t, srv.Start(ctx), "starting a running server does nothing")
	require.Equal(t, 2, countRows(t, srv.DSN()))

	t.Run("env", func(t *testing.T) {
		t.Setenv(EnvDatabaseURL, srv.DSN())
		env, err := Start(ctx, Options{})
		require.NoError(t, err)
		require.Equal(t, kindEnv, env.Kind())
		require.Equal(t, srv.DSN(), env.DSN())
		require.False(t, env.CanRestart())
		require.Error(t, env.Stop(Fast))
		require.Error(t, env.Start(ctx))
		require.Error(t, env.Restart(ctx, Fast))
		require.NoError(t, env.Close())
		require.Equal(t, 2, countRows(t, srv.DSN()), "closing an env server leaves it alone")

		fromMain := ForTestMain(Options{})
		require.Equal(t, kindEnv, fromMain.Kind())
		require.NoError(t, fromMain.Close())
	})

	dsn = srv.DSN()
	require.NoError(t, srv.Close())
	require.NoError(t, srv.Close(), "Close is idempotent")
	require.Error(t, srv.Start(ctx), "a closed server cannot start")
	require.Error(t, pgproc.Ping(ctx, dsn, 2*time.Second))
	if dir != "" {
		require.NoDirExists(t, dir)
		addr := strings.TrimSuffix(strings.TrimPrefix(dsn, "postgres://postgres@"), "/postgres?sslmode=disable")
		c, err := (&net.Dialer{Timeout: time.Second}).DialContext(context.Background(), "tcp", addr)
		if err == nil {
			_ = c.Close()
		}
		require.Error(t, err, "nothing listens on %s any more", addr)
	}
}

func TestDurable(t *testing.T) {
	skipUnderShort(t)
	t.Setenv(EnvDatabaseURL, "")
	srv, err := Start(context.Background(), Options{Durable: true})
	require.NoError(t, err)
	defer func() { require.NoError(t, srv.Close()) }()
	conn := connect(t, srv.DSN())
	for _, name := range []string{"fsync", "synchronous_commit", "full_page_writes"} {
		var v string
		require.NoError(t, conn.QueryRow(context.Background(), "SHOW "+name).Scan(&v))
		require.Equal(t, "on", v, name)
	}
}

func TestEnvNotAnswering(t *testing.T) {
	port, err := pgproc.FreePort()
	require.NoError(t, err)
	dsn := "postgres://lease:s3cr3t@127.0.0.1:" + strconv.Itoa(port) + "/db?sslmode=disable"
	t.Setenv(EnvDatabaseURL, dsn)
	_, err = Start(context.Background(), Options{})
	require.Error(t, err)
	require.Contains(t, err.Error(), "pgserver: ")
	require.Contains(t, err.Error(), "lease:xxxxx@127.0.0.1")
	require.NotContains(t, err.Error(), "s3cr3t")
}

func TestDockerProbeIsQuick(t *testing.T) {
	began := time.Now()
	err := dockerAvailable(context.Background())
	took := time.Since(began)
	t.Logf("docker probe: %v after %s", err, took.Round(time.Millisecond))
	require.Less(t, took, dockerProbe+time.Second)
}

func TestNoServerError(t *testing.T) {
	err := noServerError([]string{"Docker: no daemon", "local binaries: not found"})
	for _, want := range []string{
		"PGLEASE_DATABASE_URL=postgres://user:pass@host:5432/db",
		"Docker daemon",
		"apt-get install -y postgresql",
		"brew install postgresql",
		"local binaries: not found",
	} {
		require.Contains(t, err.Error(), want)
	}
}

func TestChooseBinDir(t *testing.T) {
	have := func(dirs ...string) func(string) bool {
		return func(d string) bool {
			for _, x := range dirs {
				if x == d {
					return true
				}
			}
			return false
		}
	}
	versions := []string{
		"/usr/lib/postgresql/9.6/bin",
		"/usr/lib/postgresql/15/bin",
		"/usr/lib/postgresql/10/bin",
		"/usr/lib/postgresql/16/bin",
		"/usr/lib/postgresql/15.2/bin",
	}
	all := have(append([]string{"/opt/pg/bin", "/cfg/bin"}, versions...)...)

	dir, ok := chooseBinDir([]string{"/opt/pg/bin"}, "/cfg/bin", versions, all)
	require.True(t, ok)
	require.Equal(t, "/opt/pg/bin", dir, "$PATH first")

	dir, ok = chooseBinDir([]string{"/usr/local/bin"}, "/cfg/bin", versions, all)
	require.True(t, ok)
	require.Equal(t, "/cfg/bin", dir, "then pg_config --bindir")

	dir, ok = chooseBinDir(nil, "", versions, all)
	require.True(t, ok)
	require.Equal(t, "/usr/lib/postgresql/16/bin", dir, "then the newest version, numerically")

	dir, ok = chooseBinDir(nil, "", versions, have(versions[0], versions[1], versions[2], versions[4]))
	require.True(t, ok)
	require.Equal(t, "/usr/lib/postgresql/15.2/bin", dir, "newest that has both programs")

	_, ok = chooseBinDir([]string{"/x"}, "/y", nil, all)
	require.False(t, ok)
}

func TestFindBinDir(t *testing.T) {
	dir, err := findBinDir()
	require.NoError(t, err, "this machine has PostgreSQL server binaries")
	require.True(t, hasServerBinaries(dir))
	require.FileExists(t, filepath.Join(dir, "initdb"))
	t.Logf("found %s", dir)
}

func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"postgres://user:secret@host:5432/db":                         "postgres://user:xxxxx@host:5432/db",
		"postgres://user:secret@host/db?sslmode=disable":              "postgres://user:xxxxx@host/db?sslmode=disable",
		"postgresql://user:p@ss@host/db":                              "postgresql://user:xxxxx@host/db",
		"postgres://user:pa/ss@host/db":                               "postgres://user:xxxxx@host/db",
		"postgres://user@host/db":                                     "postgres://user@host/db",
		"postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable": "postgres://postgres@127.0.0.1:5432/postgres?sslmode=disable",
		"postgres://host/db?user=u&password=secret&sslmode=disable":   "postgres://host/db?user=u&password=xxxxx&sslmode=disable",
		"host=h user=u password=secret dbname=d":                      "host=h user=u password=xxxxx dbname=d",
		"host=h password = 'sec ret' dbname=d":                        "host=h password = xxxxx dbname=d",
		"host=h PASSWORD=secret":                                      "host=h PASSWORD=xxxxx",
		"":                                                            "",
	} {
		got := Redact(in)
		require.Equal(t, want, got, in)
		require.NotContains(t, got, "secret")
	}
}

// TestMajors covers how a run picks the major it tests: PGLEASE_PG_BINDIR
// names the binaries, whose own libraries their programs are given, and
// the server started reports its major.
func TestMajors(t *testing.T) {
	skipUnderShort(t)
	// fakeBin makes root/bin with executable initdb and postgres, and
	// root/lib with the given files.
	fakeBin := func(t *testing.T, libs ...string) string {
		t.Helper()
		root := t.TempDir()
		bin := filepath.Join(root, "bin")
		require.NoError(t, os.MkdirAll(bin, 0o755))
		require.NoError(t, os.MkdirAll(filepath.Join(root, "lib"), 0o755))
		for _, name := range []string{"initdb", "postgres"} {
			require.NoError(t, os.WriteFile(filepath.Join(bin, name), []byte("#!/bin/sh\n"), 0o755))
		}
		for _, name := range libs {
			require.NoError(t, os.WriteFile(filepath.Join(root, "lib", name), nil, 0o644))
		}
		return bin
	}

	t.Run("BinDirVariableChoosesTheBinaries", func(t *testing.T) {
		bin := fakeBin(t)
		t.Setenv(EnvBinDir, bin)
		dir, err := findBinDir()
		require.NoError(t, err)
		require.Equal(t, bin, dir, "the directory named, over $PATH and /usr/lib/postgresql")

		t.Setenv(EnvBinDir, filepath.Dir(bin))
		_, err = findBinDir()
		require.ErrorContains(t, err, EnvBinDir+"=", "a directory without the binaries is refused, not replaced by another major")

		t.Setenv(EnvBinDir, "")
		dir, err = findBinDir()
		require.NoError(t, err)
		require.NotEqual(t, bin, dir, "unset, the local binaries are found as before")
	})

	t.Run("ChildrenGetThePackagesLibraries", func(t *testing.T) {
		bin := fakeBin(t, "libicuuc.so.60.2")
		lib := filepath.Join(filepath.Dir(bin), "lib")
		env := []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/x", "LD_PRELOAD=/y.so"}
		got := ChildEnv(bin, env)
		require.ElementsMatch(t, []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=" + lib + ":/opt/x", "LD_PRELOAD=/y.so"}, got)
		require.Equal(t, []string{"PATH=/usr/bin", "LD_LIBRARY_PATH=/opt/x", "LD_PRELOAD=/y.so"}, env, "the caller's slice is left alone")
		require.Contains(t, ChildEnv(bin, []string{"PATH=/usr/bin"}), "LD_LIBRARY_PATH="+lib)
		require.Contains(t, ChildEnv(bin, []string{"LD_LIBRARY_PATH="}), "LD_LIBRARY_PATH="+lib)

		distro := fakeBin(t, "plpgsql.so")
		require.Equal(t, env, ChildEnv(distro, env), "binaries without libraries of their own: the environment as is")
		require.NotContains(t, strings.Join(os.Environ(), "\n"), lib, "nothing is set in our own environment")

		l := &localServer{bin: bin, dir: t.TempDir()}
		require.Contains(t, l.command(context.Background(), "postgres").Env, "LD_LIBRARY_PATH="+lib)
	})

	t.Run("InitdbMakesTheSameClusterOnEveryMajor", func(t *testing.T) {
		for _, line := range []string{"initdb (PostgreSQL) 14.23\n", "initdb (PostgreSQL) 18.4", "initdb (PostgreSQL) 19beta1"} {
			major, err := parseMajor(line)
			require.NoError(t, err, line)
			require.Equal(t, line[20:22], strconv.Itoa(major), line)
		}
		_, err := parseMajor("initdb 18")
		require.Error(t, err)

		require.NotContains(t, initdbArgs(17, "/d"), "--no-data-checksums", "17 has no such flag")
		require.Contains(t, initdbArgs(18, "/d"), "--no-data-checksums", "18 turns checksums on by default")
		require.Equal(t, initdbArgs(17, "/d"), initdbArgs(18, "/d")[:len(initdbArgs(17, "/d"))])
	})

	t.Run("ServerReportsItsMajor", func(t *testing.T) {
		t.Setenv(EnvDatabaseURL, "")
		t.Setenv(EnvNoDocker, "1")
		bin, err := findBinDir()
		require.NoError(t, err)
		want, err := binMajor(context.Background(), bin)
		require.NoError(t, err)

		srv, err := Start(context.Background(), Options{Logf: t.Logf})
		require.NoError(t, err)
		t.Cleanup(func() { _ = srv.Close() })
		num, version, err := srv.Version(context.Background())
		require.NoError(t, err)
		t.Logf("PostgreSQL %s (server_version_num %d) from %s", version, num, bin)
		require.Equal(t, want, num/10000, "the server runs the binaries' major")
		require.True(t, strings.HasPrefix(version, strconv.Itoa(want)+"."), version)

		var checksums string
		conn := connect(t, srv.DSN())
		require.NoError(t, conn.QueryRow(context.Background(), "SHOW data_checksums").Scan(&checksums))
		require.Equal(t, "off", checksums)
	})
}

// skipUnderShort skips a test that starts PostgreSQL servers under -short,
// which runs only the tests that need none; the full run has no skip.
func skipUnderShort(t *testing.T) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts PostgreSQL servers: run without -short")
	}
}
