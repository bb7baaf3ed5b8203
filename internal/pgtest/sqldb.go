package pgtest

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// SQLMode is the driver of -sqldb ("pgx" or "pq"), or empty.
func SQLMode() string { return *sqlFlag }

// checkSQLMode says what is wrong with -sqldb, if anything.
func checkSQLMode() error {
	switch *sqlFlag {
	case "", "pgx", "pq":
		return nil
	}
	return fmt.Errorf("pgtest: -sqldb=%q: use -sqldb=pgx (pgx's stdlib driver) or -sqldb=pq (lib/pq)", *sqlFlag)
}

// owners are the tests of the pools PoolWith made, for Under to close its
// database/sql pool with the test.
var owners = struct {
	sync.Mutex
	of  map[*pgxpool.Pool]testing.TB
	sql map[*pgxpool.Pool]*sql.DB
}{of: map[*pgxpool.Pool]testing.TB{}, sql: map[*pgxpool.Pool]*sql.DB{}}

func own(tb testing.TB, p *pgxpool.Pool) {
	tb.Helper()
	owners.Lock()
	owners.of[p] = tb
	owners.Unlock()
	tb.Cleanup(func() {
		owners.Lock()
		delete(owners.of, p)
		owners.Unlock()
	})
}

// Under is db as the Lockers under test take it: under -sqldb, a pool of
// the tests' (Pool, PoolAt, PoolWith, AppPool) becomes pglease.SQL on the
// database/sql pool of SQLPool; any other db, and every db without
// -sqldb, is returned as it is.
func Under(db pglease.DB) pglease.DB {
	p, ok := db.(*pgxpool.Pool)
	if !ok || *sqlFlag == "" {
		return db
	}
	if sdb := sqlPoolOf(p); sdb != nil {
		return pglease.SQL(sdb)
	}
	return db // not a pool of the tests': nothing would close its database/sql pool
}

// sqlPoolOf is SQLPool for the test that made p, or nil if p is not a
// pool of the tests'.
func sqlPoolOf(p *pgxpool.Pool) *sql.DB {
	owners.Lock()
	tb := owners.of[p]
	owners.Unlock()
	if tb == nil {
		return nil
	}
	return SQLPool(tb, p)
}

// SQLPool is the database/sql pool of -sqldb's driver on the server, user,
// settings (application_name, exec mode) and size of p, closed with the
// test that made p; one per p.
func SQLPool(tb testing.TB, p *pgxpool.Pool) *sql.DB {
	tb.Helper()
	owners.Lock()
	defer owners.Unlock()
	if db := owners.sql[p]; db != nil {
		return db
	}
	db := openSQL(tb, p, *sqlFlag)
	owners.sql[p] = db
	owner := owners.of[p]
	if owner == nil {
		owner = tb
	}
	owner.Cleanup(func() {
		owners.Lock()
		delete(owners.sql, p)
		owners.Unlock()
		_ = db.Close()
	})
	return db
}

// OpenSQL opens a database/sql pool with driver ("pgx" for pgx's stdlib,
// "pq" for lib/pq) on the server, user, settings and size of p, closed at
// cleanup. A tracer of p's sees its statements (lib/pq's too).
func OpenSQL(tb testing.TB, p *pgxpool.Pool, driver string) *sql.DB {
	tb.Helper()
	db := openSQL(tb, p, driver)
	tb.Cleanup(func() { _ = db.Close() })
	return db
}

func openSQL(tb testing.TB, p *pgxpool.Pool, driver string) *sql.DB {
	tb.Helper()
	cfg := p.Config()
	var db *sql.DB
	switch driver {
	case "pq":
		db = sql.OpenDB(TracedConnector(PQConnector(tb, p), cfg.ConnConfig.Tracer))
	case "pgx":
		db = stdlib.OpenDB(*cfg.ConnConfig.Copy())
	default:
		tb.Fatalf("pgtest: no database/sql driver %q: use pgx or pq", driver)
	}
	db.SetMaxOpenConns(int(cfg.MaxConns))
	return db
}

// PQConnector is lib/pq's connector to the server of p, as its user, with
// its settings (OpenSQL's "pq", without p's tracer).
func PQConnector(tb testing.TB, p *pgxpool.Pool) driver.Connector {
	tb.Helper()
	return pqConnector(tb, pqDSN(p.Config().ConnConfig))
}

// pqConnector is lib/pq's connector to dsn. pgtest does not import lib/pq,
// which would add it to the module graph of every module whose tests use
// pgtest: the test binary registers its "postgres" driver (a blank import).
func pqConnector(tb testing.TB, dsn string) driver.Connector {
	tb.Helper()
	probe, err := sql.Open("postgres", "")
	require.NoError(tb, err, `-sqldb=pq needs lib/pq's driver: import _ "github.com/lib/pq" in the package's tests`)
	d := probe.Driver()
	require.NoError(tb, probe.Close())
	if dc, ok := d.(driver.DriverContext); ok {
		c, err := dc.OpenConnector(dsn)
		require.NoError(tb, err)
		return c
	}
	return dsnConnector{d, dsn}
}

// dsnConnector opens connections to dsn with a driver that has no
// connector of its own, as sql.Open does.
type dsnConnector struct {
	d   driver.Driver
	dsn string
}

func (c dsnConnector) Connect(context.Context) (driver.Conn, error) { return c.d.Open(c.dsn) }
func (c dsnConnector) Driver() driver.Driver                        { return c.d }

// pqDSN is the lib/pq connection string of c.
func pqDSN(c *pgx.ConnConfig) string {
	quote := func(s string) string {
		return "'" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(s) + "'"
	}
	parts := []string{
		"host=" + quote(c.Host), fmt.Sprintf("port=%d", c.Port), "user=" + quote(c.User),
		"dbname=" + quote(c.Database), "sslmode=disable",
	}
	if c.Password != "" {
		parts = append(parts, "password="+quote(c.Password))
	}
	if c.ConnectTimeout > 0 {
		parts = append(parts, fmt.Sprintf("connect_timeout=%d", max(1, int(c.ConnectTimeout.Seconds()))))
	}
	for k, v := range c.RuntimeParams {
		parts = append(parts, k+"="+quote(v))
	}
	return strings.Join(parts, " ")
}

// BeginTx begins a transaction on db of the mode's kind, rolled back at
// cleanup unless it ended before: under -sqldb, a *sql.Tx on db's
// database/sql pool (SQLPool) when db is a pool of the tests', seen as a
// pgx.Tx (SQLTx), which Guard guards through GuardSQL; otherwise
// db.Begin.
func BeginTx(tb testing.TB, db pglease.DB) pgx.Tx {
	tb.Helper()
	tx, err := beginTx(context.Background(), db)
	require.NoError(tb, err)
	tb.Cleanup(func() { _ = tx.Rollback(context.Background()) })
	return tx
}

func beginTx(ctx context.Context, db pglease.DB) (pgx.Tx, error) {
	if p, ok := db.(*pgxpool.Pool); ok && *sqlFlag != "" {
		if sdb := sqlPoolOf(p); sdb != nil {
			tx, err := sdb.BeginTx(ctx, nil)
			if err != nil {
				return nil, err
			}
			return &SQLTx{SQL: tx}, nil
		}
	}
	return db.Begin(ctx)
}

// Guard guards tx with lease as the mode asks: GuardSQL for a *sql.Tx of
// BeginTx, Guard for any other.
func Guard(ctx context.Context, lease *pglease.Lease, tx pgx.Tx) error {
	if s, ok := tx.(*SQLTx); ok {
		return lease.GuardSQL(ctx, s.SQL)
	}
	return lease.Guard(ctx, tx)
}

// GuardedFunc runs f in a transaction on db of the mode's kind (BeginTx),
// then guards it with lease (Guard) and commits; it rolls back when f or
// the guard fails.
func GuardedFunc(ctx context.Context, db pglease.DB, lease *pglease.Lease, f func(pgx.Tx) error) error {
	tx, err := beginTx(ctx, db)
	if err != nil {
		return err
	}
	if err := f(tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	if err := Guard(ctx, lease, tx); err != nil {
		_ = tx.Rollback(context.WithoutCancel(ctx))
		return err
	}
	return tx.Commit(ctx)
}

// SQLTx is a *sql.Tx seen as the pgx.Tx the tests write with: Exec,
// QueryRow, Commit and Rollback; its other methods are not to be called.
type SQLTx struct {
	pgx.Tx // nil
	SQL    *sql.Tx
}

// Exec runs query in the transaction.
func (t *SQLTx) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	res, err := t.SQL.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	n, _ := res.RowsAffected()
	return pgconn.NewCommandTag(fmt.Sprintf("EXEC %d", n)), nil
}

// QueryRow runs query in the transaction.
func (t *SQLTx) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	return t.SQL.QueryRowContext(ctx, query, args...)
}

// Commit commits the transaction.
func (t *SQLTx) Commit(context.Context) error { return t.SQL.Commit() }

// Rollback rolls the transaction back.
func (t *SQLTx) Rollback(context.Context) error { return t.SQL.Rollback() }

// TracedConnector is c, a lib/pq connector, whose connections report each
// statement to tr, a pgx query tracer (a Statements counter of a pool, a
// fault), as pgx reports the statements of the pool it replaces; c itself
// when tr is nil. A tracer whose TraceQueryStart returns a context of
// FailStatement fails that statement with its error, unsent.
func TracedConnector(c driver.Connector, tr pgx.QueryTracer) driver.Connector {
	if tr == nil {
		return c
	}
	return tracedConnector{c, tr}
}

type failKey struct{}

// FailStatement is ctx made to fail the statement being traced with err,
// before it is sent (TracedConnector).
func FailStatement(ctx context.Context, err error) context.Context {
	return context.WithValue(ctx, failKey{}, err)
}

type tracedConnector struct {
	driver.Connector
	tr pgx.QueryTracer
}

// PQConn is what a lib/pq connection serves database/sql.
type PQConn interface {
	driver.Conn
	driver.ConnBeginTx
	driver.QueryerContext
	driver.ExecerContext
	driver.Pinger
	driver.NamedValueChecker
	driver.SessionResetter
	driver.Validator
}

// ConnectPQ opens a connection of c, a lib/pq connector, for a wrapper
// of it to serve database/sql.
func ConnectPQ(ctx context.Context, c driver.Connector) (PQConn, error) {
	dc, err := c.Connect(ctx)
	if err != nil {
		return nil, err
	}
	pc, ok := dc.(PQConn)
	if !ok {
		_ = dc.Close()
		return nil, fmt.Errorf("pgtest: a %T is not a lib/pq connection", dc)
	}
	return pc, nil
}

func (c tracedConnector) Connect(ctx context.Context) (driver.Conn, error) {
	pc, err := ConnectPQ(ctx, c.Connector)
	if err != nil {
		return nil, err
	}
	return tracedConn{pc, c.tr}, nil
}

type tracedConn struct {
	PQConn
	tr pgx.QueryTracer
}

func (c tracedConn) QueryContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Rows, error) {
	ctx = c.tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: query})
	if err, ok := ctx.Value(failKey{}).(error); ok {
		c.tr.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{Err: err})
		return nil, err
	}
	rows, err := c.PQConn.QueryContext(ctx, query, args)
	c.tr.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{Err: err})
	return rows, err
}

func (c tracedConn) ExecContext(ctx context.Context, query string, args []driver.NamedValue) (driver.Result, error) {
	ctx = c.tr.TraceQueryStart(ctx, nil, pgx.TraceQueryStartData{SQL: query})
	if err, ok := ctx.Value(failKey{}).(error); ok {
		c.tr.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{Err: err})
		return nil, err
	}
	res, err := c.PQConn.ExecContext(ctx, query, args)
	c.tr.TraceQueryEnd(ctx, nil, pgx.TraceQueryEndData{Err: err})
	return res, err
}
