package pgtest

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
)

// Mishap is what a Wire does to one statement.
type Mishap int

const (
	// LoseReply runs the statement to its commit, then fails it as a
	// connection reset before the reply would.
	LoseReply Mishap = iota + 1
	// DelayReply runs the statement to its commit and holds its reply
	// until Deliver is called; a caller whose context ends first gets the
	// context's error, as pgx does, and never the reply.
	DelayReply
	// DeliverLate fails the statement at once, as a network timeout would,
	// and sends it to the server only when Deliver is called: a statement
	// held up on the way that arrives after its sender gave up.
	DeliverLate
	// GoOn runs the statement on a context of its own: a caller whose
	// context ends before the statement has run to its commit gets the
	// context's error, and the statement goes on at the server, as through
	// a driver or a network that cannot cancel it. Ran is closed once it
	// has run.
	GoOn
)

// ErrWire is the error a Wire's mishaps return in place of a reply.
var ErrWire = errors.New("pgtest wire: the reply was lost (read tcp: connection reset by peer)")

// Wire wraps a DB as a network that misdelivers chosen statements: each
// Arm catches the next statement its match accepts.
type Wire struct {
	pglease.DB
	tb testing.TB

	mu    sync.Mutex
	armed []*Armed
	late  sync.WaitGroup
}

// Armed is one mishap waiting for its statement.
type Armed struct {
	match  func(sql string) bool
	mishap Mishap
	// Hit is closed once the statement is caught.
	Hit chan struct{}
	// Ran is closed once the statement has run on the server (for
	// DeliverLate, once delivered).
	Ran     chan struct{}
	deliver chan struct{}
	once    sync.Once
	SQL     string // the statement caught; read after Hit
}

// Deliver lets the reply through (DelayReply) or sends the statement
// (DeliverLate).
func (a *Armed) Deliver() { a.once.Do(func() { close(a.deliver) }) }

// NewWire wraps db. Statements held for late delivery are delivered when
// the test ends, and waited for.
func NewWire(tb testing.TB, db pglease.DB) *Wire {
	tb.Helper()
	w := &Wire{DB: db, tb: tb}
	tb.Cleanup(func() {
		w.mu.Lock()
		armed := w.armed
		w.armed = nil
		w.mu.Unlock()
		for _, a := range armed {
			a.Deliver()
		}
		w.late.Wait()
	})
	return w
}

// Arm makes the next statement that match accepts suffer mishap.
func (w *Wire) Arm(match func(sql string) bool, mishap Mishap) *Armed {
	a := &Armed{match: match, mishap: mishap, Hit: make(chan struct{}), Ran: make(chan struct{}), deliver: make(chan struct{})}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = append(w.armed, a)
	return a
}

// Kind matches the statements of one StatementKind.
func Kind(kind string) func(string) bool {
	return func(sql string) bool { return StatementKind(sql) == kind }
}

func (w *Wire) catch(sql string) *Armed {
	w.mu.Lock()
	defer w.mu.Unlock()
	for i, a := range w.armed {
		if a.match(sql) {
			w.armed = append(w.armed[:i], w.armed[i+1:]...)
			a.SQL = sql
			close(a.Hit)
			if a.mishap != DeliverLate {
				// Deliver at cleanup is harmless for the others.
				w.tb.Cleanup(a.Deliver)
			}
			return a
		}
	}
	return nil
}

// sendLate runs the statement once delivered, whatever its sender does.
func (w *Wire) sendLate(a *Armed, sql string, args []any) {
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		<-a.deliver
		rows, err := w.DB.Query(context.Background(), sql, args...)
		if err == nil {
			for rows.Next() {
			}
			rows.Close()
		}
		close(a.Ran)
	}()
}

// QueryRow runs sql, or the mishap armed for it.
func (w *Wire) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	a := w.catch(sql)
	if a == nil {
		return w.DB.QueryRow(ctx, sql, args...)
	}
	switch a.mishap {
	case DeliverLate:
		w.sendLate(a, sql, args)
		return driver.ErrRow{Err: ErrWire}
	case GoOn:
		rows, err := w.goOn(ctx, a, sql, args)
		if err != nil {
			return driver.ErrRow{Err: err}
		}
		return heldRow{rows}
	case LoseReply:
		return lostRow{row: w.DB.QueryRow(context.WithoutCancel(ctx), sql, args...), a: a}
	}
	return delayedRow{ctx: ctx, row: w.DB.QueryRow(context.WithoutCancel(ctx), sql, args...), a: a}
}

// Query runs sql, or the mishap armed for it.
func (w *Wire) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	a := w.catch(sql)
	if a == nil {
		return w.DB.Query(ctx, sql, args...)
	}
	switch a.mishap {
	case DeliverLate:
		w.sendLate(a, sql, args)
		return nil, ErrWire
	case GoOn:
		return w.goOn(ctx, a, sql, args)
	}
	rows, err := w.DB.Query(context.WithoutCancel(ctx), sql, args...)
	if err != nil {
		close(a.Ran)
		return nil, err
	}
	if a.mishap == LoseReply {
		for rows.Next() {
		}
		rows.Close()
		close(a.Ran)
		return nil, ErrWire
	}
	held := readToTheEnd(rows) // the statement has run, and committed
	close(a.Ran)
	held.ctx, held.a = ctx, a
	return held, nil
}

// Exec runs sql, or the mishap armed for it.
func (w *Wire) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	a := w.catch(sql)
	if a == nil {
		return w.DB.Exec(ctx, sql, args...)
	}
	if a.mishap == DeliverLate {
		w.sendLate(a, sql, args)
		return pgconn.CommandTag{}, ErrWire
	}
	tag, err := w.DB.Exec(context.WithoutCancel(ctx), sql, args...)
	close(a.Ran)
	if err != nil || a.mishap == LoseReply {
		return pgconn.CommandTag{}, errors.Join(ErrWire, err)
	}
	select {
	case <-a.deliver:
		return tag, nil
	case <-ctx.Done():
		return pgconn.CommandTag{}, ctx.Err()
	}
}

// lostRow reads the committed reply, then loses it.
// goOn runs sql to its end on a context of its own and hands its rows out
// from memory, or fails with ctx's error once ctx ends first.
func (w *Wire) goOn(ctx context.Context, a *Armed, sql string, args []any) (*delayedRows, error) {
	done := make(chan *delayedRows, 1)
	w.late.Add(1)
	go func() {
		defer w.late.Done()
		held := &delayedRows{types: pgtype.NewMap()}
		rows, err := w.DB.Query(context.WithoutCancel(ctx), sql, args...)
		if err != nil {
			held.err = err
		} else {
			held = readToTheEnd(rows)
		}
		close(a.Ran)
		done <- held
	}()
	select {
	case held := <-done:
		if held.err != nil {
			return nil, held.err
		}
		a.Deliver()
		held.ctx, held.a = ctx, a
		return held, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// heldRow is the first row of rows.
type heldRow struct{ rows *delayedRows }

func (r heldRow) Scan(dest ...any) error {
	if !r.rows.Next() {
		return cmp.Or(r.rows.Err(), pgx.ErrNoRows)
	}
	return r.rows.Scan(dest...)
}

type lostRow struct {
	row pgx.Row
	a   *Armed
}

func (r lostRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...)
	close(r.a.Ran)
	if err != nil && !errors.Is(err, pgx.ErrNoRows) {
		return err
	}
	return ErrWire
}

// delayedRow holds the reply of a statement that has run until Deliver,
// or fails with ctx's error if ctx ends first.
type delayedRow struct {
	ctx context.Context
	row pgx.Row
	a   *Armed
}

func (r delayedRow) Scan(dest ...any) error {
	err := r.row.Scan(dest...) // the statement has run by the time its reply is read
	close(r.a.Ran)
	select {
	case <-r.a.deliver:
		return err
	case <-r.ctx.Done():
		return r.ctx.Err()
	}
}

// delayedRows is delayedRow for Query: the statement's rows are read to
// their end (so Ran means it has committed) and handed out, once Deliver
// is called, from memory.
type delayedRows struct {
	ctx    context.Context
	a      *Armed
	fields []pgconn.FieldDescription
	raw    [][][]byte
	tag    pgconn.CommandTag
	err    error // the statement's, or ctx's when it ended first
	types  *pgtype.Map
	at     int // the row Scan reads, 1-based
	waited bool
}

// readToTheEnd copies what it keeps of rows while they are open: once
// Next returns false, pgxpool has given their connection back, and the
// next statement on it writes the field descriptions over (they live in
// the connection's buffer).
func readToTheEnd(rows pgx.Rows) *delayedRows {
	r := &delayedRows{types: pgtype.NewMap(), fields: slices.Clone(rows.FieldDescriptions())}
	for rows.Next() {
		row := make([][]byte, 0, len(rows.RawValues()))
		for _, v := range rows.RawValues() {
			row = append(row, append([]byte(nil), v...))
		}
		r.raw = append(r.raw, row)
	}
	rows.Close()
	r.tag, r.err = rows.CommandTag(), rows.Err()
	return r
}

func (r *delayedRows) Next() bool {
	if !r.waited {
		r.waited = true
		select {
		case <-r.a.deliver:
		case <-r.ctx.Done():
			r.err, r.raw = r.ctx.Err(), nil
		}
	}
	if r.at >= len(r.raw) {
		return false
	}
	r.at++
	return true
}

func (r *delayedRows) Scan(dest ...any) error {
	return pgx.ScanRow(r.types, r.fields, r.RawValues(), dest...)
}

func (r *delayedRows) Values() ([]any, error) {
	return nil, errors.New("pgtest wire: Values of a held reply is not supported")
}

func (r *delayedRows) RawValues() [][]byte {
	if r.at == 0 || r.at > len(r.raw) {
		return nil
	}
	return r.raw[r.at-1]
}

func (r *delayedRows) FieldDescriptions() []pgconn.FieldDescription { return r.fields }
func (r *delayedRows) CommandTag() pgconn.CommandTag                { return r.tag }
func (r *delayedRows) Conn() *pgx.Conn                              { return nil }
func (r *delayedRows) Close()                                       {}
func (r *delayedRows) Err() error                                   { return r.err }
func (r *delayedRows) TypeMap() *pgtype.Map                         { return r.types }
