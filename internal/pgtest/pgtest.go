// Package pgtest is what the tests of every package of pglease share: the
// PostgreSQL server of the test binary (and private ones a test may stop
// or crash), pools and tables on it, quiet Lockers, a reader of lease
// rows, row and table locks held by other transactions, fault proxies and
// pools through them, ledgers of guarded writes, a recorder of a Locker's
// events, a statement counter and a DB that fails or holds statements on
// demand.
//
// A package's tests start with
//
//	func TestMain(m *testing.M) { pgtest.Main(m) }
//
// and isolate themselves with a table each (Table), so that they can run in
// parallel on the one server.
package pgtest

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgserver"
)

// Server is the one PostgreSQL every test of the binary shares; Main
// starts it.
var Server *pgserver.Server

// throughPooler runs the tests' pools through a PgBouncer in transaction
// pooling mode, with the pgx exec mode README recommends for it, so that
// the contract tests show that claims through a pooler behave exactly as
// direct ones: go test -run '...' . -args -pooler
var throughPooler = flag.Bool("pooler", false, "send every test pool through a PgBouncer in transaction pooling mode")

// sqlFlag is -sqldb: the contract tests build their Lockers and Electors
// on pglease.SQL over database/sql with pgx's stdlib driver ("pgx") or
// lib/pq ("pq"), to show they keep every guarantee there:
// go test -run '...' . -args -sqldb=pq
//
// Under it, Locker, NewFaultyDB and BeginTx take a *pgxpool.Pool of the
// tests as a database/sql pool of the same server, user, settings and size
// (Under, SQLPool); the tests' reads of rows and ledgers keep the pgx pool.
var sqlFlag = flag.String("sqldb", "", "build the Lockers under test on pglease.SQL with this database/sql driver: pgx (pgx's stdlib) or pq (lib/pq)")

// poolerDSN is the PgBouncer of -pooler, or empty.
var poolerDSN string

// every is what Main's options ask done to every Locker and Elector the
// tests build (Locker, Each). Main sets it before any test runs, and
// nothing changes it after.
var every struct {
	locker  []func(*pglease.Locker)
	elector []func(*pglease.Elector)
	leaks   []goleak.Option
	short   string // ShortRun's pattern
}

// MainOption is an option of Main.
type MainOption func()

// IgnoreGoroutines makes Main's leak check ignore the goroutines these
// goleak options name: a dependency's that never ends (GORM's statement
// cache), never pglease's own.
func IgnoreGoroutines(opts ...goleak.Option) MainOption {
	return func() { every.leaks = append(every.leaks, opts...) }
}

// ShortRun names, as go test's -run does, the tests of the package that
// need no server: under -short (go test -short ./...) without -bench, Main
// starts no server and runs only these, unless -run is given. Without
// ShortRun, a package runs no test under -short.
func ShortRun(pattern string) MainOption {
	return func() { every.short = pattern }
}

// MostParallel caps go test's -parallel at n for the package: its tests
// crash, fail over and starve servers, each bounding how long a key may
// go without a lease, and more of them at once starve each other.
func MostParallel(n int) MainOption {
	return func() {
		f := flag.Lookup("test.parallel")
		if cur, err := strconv.Atoi(f.Value.String()); err == nil && cur > n {
			_ = f.Value.Set(strconv.Itoa(n))
		}
	}
}

// EveryLocker has f applied to every Locker that Locker builds, and to
// every one a test passes through Each, before its first claim.
func EveryLocker(f func(*pglease.Locker)) MainOption {
	return func() { every.locker = append(every.locker, f) }
}

// EveryElector has f applied to every Elector a test passes through Each,
// before its first campaign.
func EveryElector(f func(*pglease.Elector)) MainOption {
	return func() { every.elector = append(every.elector, f) }
}

// Each applies what Main's options ask of every Locker (EveryLocker) or
// Elector (EveryElector) to v, and returns it: a test that builds its own
// with pglease.NewLocker or pglease.NewElector passes it through Each.
func Each[T *pglease.Locker | *pglease.Elector](v T) T {
	switch x := any(v).(type) {
	case *pglease.Locker:
		for _, f := range every.locker {
			f(x)
		}
	case *pglease.Elector:
		for _, f := range every.elector {
			f(x)
		}
	}
	return v
}

// Main starts the server (and the PgBouncer of -pooler), runs the tests,
// stops what it started and exits; the run fails when a goroutine is left
// behind. opts apply to every test of the binary.
func Main(m *testing.M, opts ...MainOption) {
	flag.Parse()
	if err := checkSQLMode(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	for _, o := range opts {
		o()
	}
	if testing.Short() && flag.Lookup("test.bench").Value.String() == "" {
		os.Exit(shortRun(m)) // with -bench, -short shortens the benchmarks, which need the server
	}
	Server = pgserver.ForTestMain(pgserver.Options{})
	code := 1
	if b, ok := startPooler(); ok {
		code = m.Run()
		if b != nil {
			if err := b.Close(); err != nil {
				fmt.Fprintln(os.Stderr, err)
				code = 1
			}
		}
	}
	os.Exit(Server.AfterTests(code, every.leaks...))
}

// shortRun runs, with no server, the tests ShortRun names (or those -run
// names), and checks that none left a goroutine behind.
func shortRun(m *testing.M) int {
	if run := flag.Lookup("test.run"); run.Value.String() == "" {
		pattern := every.short
		if pattern == "" {
			pattern = "^$"
		}
		if err := run.Value.Set(pattern); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 2
		}
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(every.leaks...); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	return code
}

// startPooler starts the PgBouncer of -pooler; ok is false when it failed.
func startPooler() (b *pgbouncer.Bouncer, ok bool) {
	if !*throughPooler {
		return nil, true
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b, err := pgbouncer.Start(ctx, Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 20})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		return nil, false
	}
	poolerDSN = b.DSN()
	return b, true
}

// PrivateServer starts a PostgreSQL of the test's own, which it may stop
// and restart without disturbing the other tests, closed at cleanup. It is
// durable (fsync and synchronous_commit on), as production is: a claim
// acknowledged before a crash must survive it, or fences could go
// backwards.
func PrivateServer(tb testing.TB) *pgserver.Server {
	tb.Helper()
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Private: true, Durable: true})
	require.NoError(tb, err)
	tb.Cleanup(func() { require.NoError(tb, srv.Close()) })
	// Private never uses PGLEASE_DATABASE_URL: the server is ours to stop.
	require.True(tb, srv.CanRestart(), "a %s server cannot be restarted", srv.Kind())
	return srv
}

// ThroughPooler reports whether the tests run through PgBouncer (-pooler).
func ThroughPooler() bool { return poolerDSN != "" }

// Ctx is a context that ends with the test, or after 30 seconds.
func Ctx(tb testing.TB) context.Context {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// Quiet is a logger that discards everything.
var Quiet = slog.New(slog.DiscardHandler)

// Pool connects to the shared server (through the PgBouncer of -pooler),
// with tracer if not nil; it is closed at cleanup.
func Pool(tb testing.TB, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	if poolerDSN != "" {
		return pool(tb, poolerDSN, tracer, pgx.QueryExecModeExec)
	}
	if Server == nil {
		tb.Fatal("pgtest: this test needs a PostgreSQL server, and under -short none is started: run it without -short")
	}
	return pool(tb, Server.DSN(), tracer, 0)
}

// PoolAt connects to dsn (another server, a proxy), with tracer if not
// nil; it is closed at cleanup.
func PoolAt(tb testing.TB, dsn string, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	return pool(tb, dsn, tracer, 0)
}

func pool(tb testing.TB, dsn string, tracer pgx.QueryTracer, mode pgx.QueryExecMode) *pgxpool.Pool {
	tb.Helper()
	return PoolWith(tb, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 8
		if mode != 0 {
			cfg.ConnConfig.DefaultQueryExecMode = mode
		}
		if tracer != nil {
			cfg.ConnConfig.Tracer = tracer
		}
	})
}

// PoolWith connects to dsn with pgxpool's defaults changed by configure
// (if not nil): a session setting, a user, a proxy's address, a pool size.
// The pool is closed at cleanup (closing it earlier is harmless).
func PoolWith(tb testing.TB, dsn string, configure func(*pgxpool.Config)) *pgxpool.Pool {
	tb.Helper()
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(tb, err)
	if configure != nil {
		configure(cfg)
	}
	p, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(tb, err)
	tb.Cleanup(func() { closePool(tb, p, poolCloseWait) })
	own(tb, p)
	return p
}

// closePool closes p, which waits for every connection acquired from it.
// One still acquired after wait (a transaction a failed test left open)
// fails the test, naming it, instead of hanging the test binary; the
// channel returned is closed once p is.
func closePool(tb testing.TB, p *pgxpool.Pool, wait time.Duration) <-chan struct{} {
	tb.Helper()
	closed := make(chan struct{})
	go func() {
		defer close(closed)
		p.Close()
	}()
	select {
	case <-closed:
	case <-time.After(wait):
		tb.Errorf("pgtest: the pool still has %d connections acquired %v after the test ended: a transaction or rows left open", p.Stat().AcquiredConns(), wait)
	}
	return closed
}

// poolCloseWait is how long closePool waits for the connections still
// acquired: longer than pgx's own clean-up of a connection on a stalled
// link (15 s).
const poolCloseWait = 30 * time.Second

var tableSeq atomic.Int64

// Name is prefix made unique among the tests of every package (the process
// id tells the packages apart when they share a server), for the tables,
// schemas, roles and databases a test creates.
func Name(prefix string) string {
	return fmt.Sprintf("%s_p%d_%d", prefix, os.Getpid(), tableSeq.Add(1))
}

// TableName is a lease table name no other test uses; the table is not
// created.
func TableName() string { return Name("lease") }

// Table returns a fresh table, created by Migrate.
func Table(tb testing.TB, db pglease.DB) string {
	tb.Helper()
	name := TableName()
	require.NoError(tb, pglease.Migrate(context.Background(), db, pglease.WithTable(name)))
	return name
}

// Setup is how most tests begin: a context that ends with the test (Ctx),
// a pool on the shared server (Pool, without a tracer) and a fresh lease
// table on it (Table).
func Setup(tb testing.TB) (context.Context, *pgxpool.Pool, string) {
	tb.Helper()
	ctx := Ctx(tb)
	p := Pool(tb, nil)
	return ctx, p, Table(tb, p)
}

// PrivateSetup is Setup on a PrivateServer, which the test may stop and
// restart: a context that ends with the test, the server, a pool on it and
// a fresh lease table.
func PrivateSetup(tb testing.TB) (context.Context, *pgserver.Server, *pgxpool.Pool, string) {
	tb.Helper()
	srv := PrivateServer(tb)
	ctx := Ctx(tb) // its 30 s from the server's start, however long that took
	p := PoolAt(tb, srv.DSN(), nil)
	return ctx, srv, p, Table(tb, p)
}

// SetupCounted is Setup with the pool's statements counted from the start,
// the table's creation included.
func SetupCounted(tb testing.TB) (context.Context, *pgxpool.Pool, string, *Statements) {
	tb.Helper()
	ctx, counter := Ctx(tb), &Statements{}
	p := Pool(tb, counter)
	return ctx, p, Table(tb, p), counter
}

// Locker returns a quiet Locker on table, closed at cleanup, with what
// Main's options ask of every Locker (EveryLocker) applied; under -sqldb a
// pool of the tests' is taken through database/sql (Under), unless opts
// ask for what only a pool gives (WithKeptConnection): that Locker stays on
// the pool, and the test's log says so.
func Locker(tb testing.TB, db pglease.DB, table, holder string, opts ...pglease.Option) *pglease.Locker {
	tb.Helper()
	all := append([]pglease.Option{pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(Quiet)}, opts...)
	l, err := newLocker(Under(db), all)
	if _, pool := db.(*pgxpool.Pool); err != nil && pool && *sqlFlag != "" && errors.Is(err, pglease.ErrInvalidOption) {
		tb.Logf("pgtest: -sqldb=%s: this Locker stays on the pool: %v", *sqlFlag, err)
		l, err = newLocker(db, all)
	}
	require.NoError(tb, err)
	l = Each(l)
	tb.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// newLocker is pglease.NewLocker returning the error it panics with.
func newLocker(db pglease.DB, opts []pglease.Option) (l *pglease.Locker, err error) {
	defer func() {
		if r := recover(); r != nil {
			e, ok := r.(error)
			if !ok {
				panic(r)
			}
			err = e
		}
	}()
	return pglease.NewLocker(db, opts...), nil
}

// TakeOver claims key with l again and again until the server lets it, as
// a replica waiting for a lapsed lease, within limit: the test fails unless
// the new mandate's fence is above the one of prev.
func TakeOver(ctx context.Context, tb testing.TB, l *pglease.Locker, key string, prev *pglease.Lease, limit time.Duration) *pglease.Lease {
	tb.Helper()
	var next *pglease.Lease
	require.Eventually(tb, func() bool {
		var err error
		next, err = l.Claim(ctx, key)
		return err == nil
	}, limit, 5*time.Millisecond, "%s never took %q", l.Holder(), key)
	require.Greater(tb, next.Fence(), prev.Fence())
	return next
}

// Claimed is the outcome of a claim that ran in the background
// (ClaimInBackground).
type Claimed struct {
	Lease *pglease.Lease
	Err   error
}

// ClaimInBackground starts l.Claim(ctx, key) in a goroutine of its own and
// returns the channel that receives its outcome, once: for a claim the test
// expects to wait (on a row lock, a stalled link) while it does something
// else. The goroutine ends when the claim returns, at the latest when ctx
// ends.
func ClaimInBackground(ctx context.Context, l *pglease.Locker, key string) <-chan Claimed {
	out := make(chan Claimed, 1)
	go func() {
		lease, err := l.Claim(ctx, key)
		out <- Claimed{lease, err}
	}()
	return out
}

// Row is a row of a lease table as the server sees it now.
type Row struct {
	Holder     string
	Fence      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Live       bool // expires_at is after the server's clock
}

// ReadRow reads the row of key in table ("name" or "schema.name"), and
// whether there is one.
func ReadRow(tb testing.TB, db pglease.DB, table, key string) (Row, bool) {
	tb.Helper()
	var r Row
	err := db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT holder, fence, acquired_at, expires_at, expires_at > clock_timestamp() FROM %s WHERE key = $1`,
			pgx.Identifier(strings.Split(table, ".")).Sanitize()), key).
		Scan(&r.Holder, &r.Fence, &r.AcquiredAt, &r.ExpiresAt, &r.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(tb, err)
	return r, true
}

// WaitExpired waits until the row of key in table has expired by the
// server's clock; the test fails after limit. A plain read: a row lock
// held on the row does not hold it up.
func WaitExpired(tb testing.TB, db pglease.DB, table, key string, limit time.Duration) {
	tb.Helper()
	query := fmt.Sprintf(`SELECT expires_at <= clock_timestamp() FROM %s WHERE key = $1`,
		pgx.Identifier(strings.Split(table, ".")).Sanitize())
	require.Eventually(tb, func() bool {
		var expired bool
		err := db.QueryRow(context.Background(), query, key).Scan(&expired)
		return err == nil && expired
	}, limit, 10*time.Millisecond, "the row of %q in %s expired by the server's clock", key, table)
}

// WaitDone waits for a lease to end, failing the test after limit.
func WaitDone(tb testing.TB, lease *pglease.Lease, limit time.Duration) {
	tb.Helper()
	select {
	case <-lease.Done():
	case <-time.After(limit):
		tb.Fatalf("lease %q fence %d still held after %v", lease.Key(), lease.Fence(), limit)
	}
}
