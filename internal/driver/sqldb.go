package driver

import (
	"context"
	"database/sql"
	sqldriver "database/sql/driver"
	"errors"
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// SQLDB is a database/sql pool of PostgreSQL connections opened with pgx's
// stdlib driver ("pgx") or lib/pq ("postgres"), serving the methods of a
// pgx pool: Exec, Query, QueryRow and Begin. The server's errors read as
// *pgconn.PgError whatever the driver (lib/pq's *pq.Error stays in the
// chain), and array arguments reach lib/pq, which takes no Go slices, as
// array literals. Begin returns a pgx.Tx that serves Exec, Query,
// QueryRow, Commit and Rollback; its other methods return an error saying
// why.
type SQLDB struct {
	db *sql.DB
	sqlRunner
}

// NewSQLDB is db as a SQLDB.
func NewSQLDB(db *sql.DB) *SQLDB {
	return &SQLDB{db: db, sqlRunner: sqlRunner{on: db, inline: !takesSlices(db.Driver())}}
}

// DB is the *sql.DB under d.
func (d *SQLDB) DB() *sql.DB { return d.db }

// cancelsOnce reports whether the driver sends the cancel request of a
// statement whose context ended itself, once, on a connection of its own
// that pglease cannot reach to send it again (lib/pq): a request that
// reaches the backend before the statement is lost. pgx's stdlib gives
// pglease its pgx connection (SQLConn.pgConn), on which it sends its own.
func (d *SQLDB) cancelsOnce() bool { return d.inline }

var (
	_ pgx.Tx   = (*SQLTx)(nil)
	_ pgx.Rows = (*sqlRows)(nil)
	_ pgx.Row  = sqlRow{}
)

// takesSlices reports whether d, a database/sql driver, encodes Go slices
// as PostgreSQL arrays itself: pgx's stdlib does, lib/pq does not.
func takesSlices(d sqldriver.Driver) bool {
	t := reflect.TypeOf(d)
	for t != nil && t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	return t != nil && strings.HasPrefix(t.PkgPath(), "github.com/jackc/pgx/")
}

// sqlSession is what *sql.DB, *sql.Conn and *sql.Tx have in common.
type sqlSession interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
}

// sqlRunner serves DB's Exec, Query and QueryRow on a sqlSession, for
// SQLDB, SQLConn and SQLTx alike.
type sqlRunner struct {
	on sqlSession
	// inline sends each statement with its arguments written in its text
	// (inlineArgs): the driver (lib/pq) sends a statement with arguments in
	// two round trips, and takes no Go slices.
	inline bool
}

// Exec is DB's Exec, sent through database/sql.
func (r sqlRunner) Exec(ctx context.Context, query string, args ...any) (pgconn.CommandTag, error) {
	query, args, err := sqlArgs(r.inline, query, args)
	if err != nil {
		return pgconn.CommandTag{}, err
	}
	res, err := r.on.ExecContext(ctx, query, args...)
	if err != nil {
		return pgconn.CommandTag{}, sqlError(err)
	}
	n, err := res.RowsAffected()
	if err != nil {
		n = 0 // a statement that affects no rows (DDL, SET)
	}
	verb, _, _ := strings.Cut(strings.TrimSpace(query), " ")
	return pgconn.NewCommandTag(fmt.Sprintf("%s %d", strings.ToUpper(verb), n)), nil
}

// Query is DB's Query, sent through database/sql.
func (r sqlRunner) Query(ctx context.Context, query string, args ...any) (pgx.Rows, error) {
	query, args, err := sqlArgs(r.inline, query, args)
	if err != nil {
		return nil, err
	}
	rows, err := r.on.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, sqlError(err)
	}
	return &sqlRows{rows: rows}, nil
}

// QueryRow is DB's QueryRow, sent through database/sql.
func (r sqlRunner) QueryRow(ctx context.Context, query string, args ...any) pgx.Row {
	rows, err := r.Query(ctx, query, args...)
	if err != nil {
		return ErrRow{err}
	}
	return sqlRow{rows.(*sqlRows)}
}

// began is the SQLTx of tx, begun by r's BeginTx, its statements sent as
// r's.
func (r sqlRunner) began(tx *sql.Tx, err error) (pgx.Tx, error) {
	if err != nil {
		return nil, sqlError(err)
	}
	return &SQLTx{tx: tx, sqlRunner: sqlRunner{on: tx, inline: r.inline}}, nil
}

// Begin is DB's Begin, sent through database/sql.
func (d *SQLDB) Begin(ctx context.Context) (pgx.Tx, error) { return d.began(d.db.BeginTx(ctx, nil)) }

// Conn takes a connection of d for one statement (or as a Locker's
// reserve): SQLConn.Close gives it back.
func (d *SQLDB) Conn(ctx context.Context) (*SQLConn, error) {
	conn, err := d.db.Conn(ctx)
	if err != nil {
		return nil, err
	}
	return &SQLConn{conn: conn, sqlRunner: sqlRunner{on: conn, inline: d.inline}}, nil
}

// SQLConn is one connection of a SQLDB, taken for one statement.
type SQLConn struct {
	conn *sql.Conn
	sqlRunner
}

// Begin is DB's Begin, sent through database/sql.
func (c *SQLConn) Begin(ctx context.Context) (pgx.Tx, error) {
	return c.began(c.conn.BeginTx(ctx, nil))
}

// Close gives the connection back to its pool. database/sql drops a
// connection its driver reports bad.
func (c *SQLConn) Close() { _ = c.conn.Close() }

// Ping checks that the connection is still alive.
func (c *SQLConn) Ping(ctx context.Context) error { return c.conn.PingContext(ctx) }

// PgConn is the pgx connection under the stdlib driver's, which a claim's
// cancel requests are sent on; nil for lib/pq, which sends its own as the
// statement's context ends (then waits for the server to take it, and
// closes the connection). A pgx connection closed under it is destroyed
// by database/sql (the stdlib driver reports it bad).
func (c *SQLConn) PgConn() *pgconn.PgConn {
	var pc *pgconn.PgConn
	_ = c.conn.Raw(func(dc any) error {
		if x, ok := dc.(interface{ Conn() *pgx.Conn }); ok {
			pc = x.Conn().PgConn()
		}
		return nil
	})
	return pc
}

// sqlRows is a *sql.Rows as pgx.Rows. A nil destination of Scan skips its
// column, as in pgx; the errors of the server read as *pgconn.PgError
// (sqlError).
type sqlRows struct {
	rows     *sql.Rows
	closeErr error
	closed   bool
}

func (r *sqlRows) Close() {
	if !r.closed {
		r.closed = true
		r.closeErr = r.rows.Close() // a statement's error may come after its rows (at its commit)
	}
}

func (r *sqlRows) Err() error {
	if err := r.rows.Err(); err != nil {
		return sqlError(err)
	}
	return sqlError(r.closeErr)
}

func (r *sqlRows) CommandTag() pgconn.CommandTag { return pgconn.NewCommandTag("") }

func (r *sqlRows) FieldDescriptions() []pgconn.FieldDescription {
	cols, _ := r.rows.Columns()
	fds := make([]pgconn.FieldDescription, len(cols))
	for i, c := range cols {
		fds[i].Name = c
	}
	return fds
}

func (r *sqlRows) Next() bool {
	if r.closed {
		return false
	}
	if !r.rows.Next() {
		r.Close()
		return false
	}
	return true
}

func (r *sqlRows) Scan(dest ...any) error {
	dest = append([]any(nil), dest...)
	for i, d := range dest {
		if d == nil {
			dest[i] = new(any)
		}
	}
	return sqlError(r.rows.Scan(dest...))
}

func (r *sqlRows) Values() ([]any, error) {
	cols, err := r.rows.Columns()
	if err != nil {
		return nil, sqlError(err)
	}
	vals := make([]any, len(cols))
	ptrs := make([]any, len(cols))
	for i := range vals {
		ptrs[i] = &vals[i]
	}
	return vals, r.Scan(ptrs...)
}

func (r *sqlRows) RawValues() [][]byte { return nil }

// TypeMap is a map of pgx's default types: database/sql has decoded the
// values already.
func (r *sqlRows) TypeMap() *pgtype.Map { return pgtype.NewMap() }

func (r *sqlRows) Conn() *pgx.Conn { return nil }

// sqlRow is the row of QueryRow: pgx.ErrNoRows when there is none, and the
// statement's error when it came after the row.
type sqlRow struct{ rows *sqlRows }

func (r sqlRow) Scan(dest ...any) error {
	defer r.rows.Close()
	if !r.rows.Next() {
		if err := r.rows.Err(); err != nil {
			return err
		}
		return pgx.ErrNoRows
	}
	if err := r.rows.Scan(dest...); err != nil {
		return err
	}
	r.rows.Close()
	return r.rows.Err()
}

// SQLTx is a *sql.Tx as the pgx.Tx of Begin and GuardSQL: Exec, Query,
// QueryRow, Commit and Rollback. A tx that has ended reads as
// pgx.ErrTxClosed (and sql.ErrTxDone).
type SQLTx struct {
	tx *sql.Tx
	sqlRunner
}

// NewSQLTx is tx as a SQLTx, each statement sent with its arguments
// written in its text, whatever tx's driver.
func NewSQLTx(tx *sql.Tx) *SQLTx { return &SQLTx{tx: tx, sqlRunner: sqlRunner{on: tx, inline: true}} }

// errSQLTx is the error of the pgx.Tx methods a *sql.Tx cannot serve.
func errSQLTx(method string) error {
	return fmt.Errorf("pglease: %s is not available on a database/sql transaction (pglease.SQL): only Exec, Query, QueryRow, Commit and Rollback are", method)
}

// Begin is pgx.Tx's Begin on the database/sql transaction.
func (t *SQLTx) Begin(context.Context) (pgx.Tx, error) {
	return nil, errSQLTx("Begin (a savepoint)")
}

// Commit is pgx.Tx's Commit on the database/sql transaction.
func (t *SQLTx) Commit(context.Context) error { return sqlError(t.tx.Commit()) }

// Rollback is pgx.Tx's Rollback on the database/sql transaction.
func (t *SQLTx) Rollback(context.Context) error { return sqlError(t.tx.Rollback()) }

// CopyFrom is pgx.Tx's CopyFrom on the database/sql transaction.
func (t *SQLTx) CopyFrom(context.Context, pgx.Identifier, []string, pgx.CopyFromSource) (int64, error) {
	return 0, errSQLTx("CopyFrom")
}

// SendBatch is pgx.Tx's SendBatch on the database/sql transaction.
func (t *SQLTx) SendBatch(context.Context, *pgx.Batch) pgx.BatchResults {
	return errBatch{errSQLTx("SendBatch")}
}

// LargeObjects is the zero pgx.LargeObjects, whose methods fail: a
// database/sql transaction has no pgx connection under it.
func (t *SQLTx) LargeObjects() pgx.LargeObjects { return pgx.LargeObjects{} }

// Prepare is pgx.Tx's Prepare on the database/sql transaction.
func (t *SQLTx) Prepare(context.Context, string, string) (*pgconn.StatementDescription, error) {
	return nil, errSQLTx("Prepare")
}

// Conn is nil: a database/sql transaction has no pgx connection to show.
func (t *SQLTx) Conn() *pgx.Conn { return nil }

// ErrRow is the pgx.Row of a statement that failed before it was sent:
// Scan returns Err.
type ErrRow struct{ Err error }

// Scan returns r.Err.
func (r ErrRow) Scan(...any) error { return r.Err }

// errBatch is the pgx.BatchResults of a batch that was not sent.
type errBatch struct{ err error }

func (b errBatch) Exec() (pgconn.CommandTag, error) { return pgconn.CommandTag{}, b.err }
func (b errBatch) Query() (pgx.Rows, error)         { return nil, b.err }
func (b errBatch) QueryRow() pgx.Row                { return ErrRow{b.err} }
func (b errBatch) Close() error                     { return b.err }
func (b errBatch) Tx() pgx.Tx                       { return nil }

// sqlState is an error of a driver that carries the fields of the
// server's ErrorResponse: lib/pq's *pq.Error.
type sqlState interface {
	SQLState() string
	Get(field byte) string
}

// sqlError makes err, an error of database/sql or its driver, read as pgx's
// do wherever pglease classifies errors: a server error carries a
// *pgconn.PgError (pgx's stdlib returns one; lib/pq's is translated, the
// original kept in the chain), a connection the driver reports bad
// (driver.ErrBadConn) leaves the statement's outcome unknown, and an ended
// transaction is pgx.ErrTxClosed.
func sqlError(err error) error {
	if err == nil {
		return nil // before the targets of As, which escape, are allocated
	}
	var st sqlState
	if _, ok := serverError(err); ok {
		return err
	}
	switch {
	case errors.As(err, &st):
		return &translatedError{pg: pgErrorOf(st), err: err}
	case errors.Is(err, sqldriver.ErrBadConn):
		// Not "not sent": lib/pq also reports a reply cut off after the
		// server ran the statement (EOF, a FATAL) as a bad connection. A
		// claim whose outcome is unknown gives back what it may have
		// committed; one that was not sent costs that read, no more.
		return fmt.Errorf("the connection went bad (the server may have run the statement): %w", err)
	case errors.Is(err, sql.ErrTxDone):
		return fmt.Errorf("%w: %w", pgx.ErrTxClosed, err)
	}
	return err
}

// pgErrorOf is the *pgconn.PgError of st's fields.
func pgErrorOf(st sqlState) *pgconn.PgError {
	atoi := func(f byte) int32 {
		n, _ := strconv.ParseInt(st.Get(f), 10, 32)
		return int32(n)
	}
	return &pgconn.PgError{
		Severity:         st.Get('S'),
		Code:             st.SQLState(),
		Message:          st.Get('M'),
		Detail:           st.Get('D'),
		Hint:             st.Get('H'),
		Position:         atoi('P'),
		InternalPosition: atoi('p'),
		InternalQuery:    st.Get('q'),
		Where:            st.Get('W'),
		SchemaName:       st.Get('s'),
		TableName:        st.Get('t'),
		ColumnName:       st.Get('c'),
		DataTypeName:     st.Get('d'),
		ConstraintName:   st.Get('n'),
		File:             st.Get('F'),
		Line:             atoi('L'),
		Routine:          st.Get('R'),
	}
}

// translatedError is a driver's server error that also reads as the
// *pgconn.PgError of its fields.
type translatedError struct {
	pg  *pgconn.PgError
	err error
}

func (e *translatedError) Error() string   { return e.err.Error() }
func (e *translatedError) Unwrap() []error { return []error{e.pg, e.err} }

// sqlArgs returns query and args as the driver takes them: with inline,
// the arguments written in the statement's text.
func sqlArgs(inline bool, query string, args []any) (string, []any, error) {
	if !inline {
		return query, args, nil
	}
	query, err := inlineArgs(query, args)
	return query, nil, err
}

// arrayLiteral is a Go slice sent as the text of a PostgreSQL array
// ('{"a","b"}', '{1.5,2}'), which the server casts to the parameter's
// array type.
type arrayLiteral struct{ v reflect.Value }

func (a arrayLiteral) Value() (sqldriver.Value, error) {
	if a.v.IsNil() {
		return nil, nil
	}
	var b strings.Builder
	b.WriteByte('{')
	for i := range a.v.Len() {
		if i > 0 {
			b.WriteByte(',')
		}
		if err := writeElement(&b, a.v.Index(i)); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.String(), nil
}

// writeElement writes e, one element of an array literal.
func writeElement(b *strings.Builder, e reflect.Value) error {
	for e.Kind() == reflect.Pointer || e.Kind() == reflect.Interface {
		if e.IsNil() {
			b.WriteString("NULL")
			return nil
		}
		e = e.Elem()
	}
	switch e.Kind() {
	case reflect.Bool:
		b.WriteString(strconv.FormatBool(e.Bool()))
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		b.WriteString(strconv.FormatInt(e.Int(), 10))
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		b.WriteString(strconv.FormatUint(e.Uint(), 10))
	case reflect.Float32, reflect.Float64:
		b.WriteString(strconv.FormatFloat(e.Float(), 'g', -1, 64))
	case reflect.String:
		if err := checkText(e.String()); err != nil {
			return err
		}
		quoteElement(b, e.String())
	default:
		if t, ok := e.Interface().(time.Time); ok {
			quoteElement(b, timeText(t))
			return nil
		}
		return fmt.Errorf("pglease: an array argument of %s cannot be sent to this database/sql driver", e.Type())
	}
	return nil
}

func quoteElement(b *strings.Builder, s string) {
	b.WriteByte('"')
	for _, r := range s {
		if r == '"' || r == '\\' {
			b.WriteByte('\\')
		}
		b.WriteRune(r)
	}
	b.WriteByte('"')
}
