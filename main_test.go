package pglease_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgserver"
)

// server is the one PostgreSQL every test of the package shares; tests
// isolate themselves with a table each.
var server *pgserver.Server

// throughPooler runs the tests' pools through a PgBouncer in transaction
// pooling mode, with the pgx exec mode README recommends for it, so that
// the contract tests show that claims through a pooler behave exactly as
// direct ones: go test -run '...' . -args -pooler
var throughPooler = flag.Bool("pooler", false, "send every test pool through a PgBouncer in transaction pooling mode")

// poolerDSN is the PgBouncer of -pooler, or empty.
var poolerDSN string

func TestMain(m *testing.M) {
	flag.Parse()
	server = pgserver.ForTestMain(pgserver.Options{})
	if *throughPooler {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		b, err := pgbouncer.Start(ctx, server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 20})
		cancel()
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(server.AfterTests(1))
		}
		poolerDSN = b.DSN()
		code := m.Run()
		if err := b.Close(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			code = 1
		}
		os.Exit(server.AfterTests(code))
	}
	os.Exit(server.AfterTests(m.Run()))
}

var tableSeq atomic.Int64

// newTable returns a fresh, migrated table name for one test.
func newTable(t *testing.T, pool *pgxpool.Pool) string {
	t.Helper()
	name := fmt.Sprintf("lease_t%d", tableSeq.Add(1))
	require.NoError(t, pglease.Migrate(context.Background(), pool, pglease.WithTable(name)))
	return name
}

// newPool connects to dsn (the shared server when empty), closed at cleanup.
func newPool(t *testing.T, dsn string, tracer pgx.QueryTracer) *pgxpool.Pool {
	t.Helper()
	pooled := dsn == "" && poolerDSN != ""
	switch {
	case pooled:
		dsn = poolerDSN
	case dsn == "":
		dsn = server.DSN()
	}
	cfg, err := pgxpool.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.MaxConns = 8
	if pooled {
		cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
	}
	if tracer != nil {
		cfg.ConnConfig.Tracer = tracer
	}
	pool, err := pgxpool.NewWithConfig(context.Background(), cfg)
	require.NoError(t, err)
	t.Cleanup(pool.Close)
	return pool
}

var quiet = slog.New(slog.DiscardHandler)

// newLocker returns a quiet Locker on table, closed at cleanup.
func newLocker(t *testing.T, db pglease.DB, table, holder string, opts ...pglease.Option) *pglease.Locker {
	t.Helper()
	all := append([]pglease.Option{pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithLogger(quiet)}, opts...)
	l := pglease.NewLocker(db, all...)
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

// leaseRow is a row of a lease table as the server sees it now.
type leaseRow struct {
	Holder     string
	Fence      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Live       bool
}

func readRow(t *testing.T, db pglease.DB, table, key string) (leaseRow, bool) {
	t.Helper()
	var r leaseRow
	err := db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT holder, fence, acquired_at, expires_at, expires_at > clock_timestamp() FROM %s WHERE key = $1`,
			pgx.Identifier{table}.Sanitize()), key).
		Scan(&r.Holder, &r.Fence, &r.AcquiredAt, &r.ExpiresAt, &r.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(t, err)
	return r, true
}

// waitDone waits for a lease to end, failing the test after limit.
func waitDone(t *testing.T, lease *pglease.Lease, limit time.Duration) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(limit):
		t.Fatalf("lease %q fence %d still held after %v", lease.Key(), lease.Fence(), limit)
	}
}

// statementCounter is a pgx tracer counting statements by their first words.
type statementCounter struct {
	mu     sync.Mutex
	counts map[string]int
}

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = make(map[string]int)
	}
	c.counts[statementKind(data.SQL)]++
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

func (c *statementCounter) get(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[kind]
}

func (c *statementCounter) reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = nil
}

// statementKind names pglease's statements: claim, heartbeat, release.
func statementKind(sql string) string {
	switch {
	case strings.HasPrefix(sql, "INSERT INTO"):
		return "claim"
	case strings.Contains(sql, "'synchronous_commit', 'off'"):
		return "release" // one or many (Close): the only statements that commit asynchronously
	case strings.Contains(sql, "unnest("):
		return "heartbeat"
	case strings.HasPrefix(sql, "UPDATE") && strings.Contains(sql, "GREATEST("):
		return "release"
	default:
		return "other"
	}
}

// faultyDB wraps a DB and lets a test fail or hold pglease's statements by
// kind, to inject the faults a network or a server would cause.
type faultyDB struct {
	pglease.DB
	mu    sync.Mutex
	fail  map[string]error         // kind -> error returned instead of running
	gate  map[string]chan struct{} // kind -> statement waits until closed
	enter chan string              // receives the kind of each gated statement
}

func newFaultyDB(db pglease.DB) *faultyDB {
	return &faultyDB{DB: db, fail: map[string]error{}, gate: map[string]chan struct{}{}, enter: make(chan string, 100)}
}

func (f *faultyDB) setFail(kind string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, kind)
	} else {
		f.fail[kind] = err
	}
}

// cut fails every statement from now on, as a crashed replica or a cut
// network would.
func (f *faultyDB) cut(err error) {
	for _, kind := range []string{"claim", "heartbeat", "release", "other"} {
		f.setFail(kind, err)
	}
}

func (f *faultyDB) hold(kind string) (release func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	ch := make(chan struct{})
	f.gate[kind] = ch
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			delete(f.gate, kind)
			f.mu.Unlock()
			close(ch)
		})
	}
}

func (f *faultyDB) before(ctx context.Context, sql string) error {
	kind := statementKind(sql)
	f.mu.Lock()
	err, gate := f.fail[kind], f.gate[kind]
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if gate != nil {
		f.enter <- kind
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

func (f *faultyDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := f.before(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	return f.DB.Begin(ctx)
}

func (f *faultyDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := f.before(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return f.DB.Exec(ctx, sql, args...)
}

func (f *faultyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := f.before(ctx, sql); err != nil {
		return nil, err
	}
	return f.DB.Query(ctx, sql, args...)
}

type errRow struct{ err error }

func (r errRow) Scan(...any) error { return r.err }

func (f *faultyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := f.before(ctx, sql); err != nil {
		return errRow{err}
	}
	return f.DB.QueryRow(ctx, sql, args...)
}

// eventLog collects a Locker's events for assertions.
type eventLog struct {
	mu     sync.Mutex
	events []pglease.Event
	signal chan pglease.Event
}

func newEventLog() *eventLog { return &eventLog{signal: make(chan pglease.Event, 1000)} }

func (e *eventLog) hook(ev pglease.Event) {
	e.mu.Lock()
	e.events = append(e.events, ev)
	e.mu.Unlock()
	select {
	case e.signal <- ev:
	default:
	}
}

func (e *eventLog) count(kind pglease.EventKind) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for _, ev := range e.events {
		if ev.Kind == kind {
			n++
		}
	}
	return n
}

// waitFor waits until an event of kind arrives, failing after limit.
func (e *eventLog) waitFor(t *testing.T, kind pglease.EventKind, limit time.Duration) pglease.Event {
	t.Helper()
	deadline := time.After(limit)
	for {
		select {
		case ev := <-e.signal:
			if ev.Kind == kind {
				return ev
			}
		case <-deadline:
			t.Fatalf("no %v event within %v", kind, limit)
		}
	}
}
