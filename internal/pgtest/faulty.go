package pgtest

import (
	"context"
	"sync"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
)

// FaultyDB wraps a DB and fails or holds pglease's statements by kind
// (StatementKind; "other" covers Begin), to inject the faults a network or
// a server would cause.
type FaultyDB struct {
	pglease.DB
	// Entered receives the kind of each statement that a Hold stops.
	Entered chan string

	mu   sync.Mutex
	fail map[string]error         // kind -> error returned instead of running
	gate map[string]chan struct{} // kind -> statement waits until closed
}

// NewFaultyDB wraps db (under -sqldb, a pool of the tests' through
// database/sql: Under), letting every statement through until told not to.
func NewFaultyDB(db pglease.DB) *FaultyDB {
	return &FaultyDB{DB: Under(db), fail: map[string]error{}, gate: map[string]chan struct{}{}, Entered: make(chan string, 100)}
}

// SetFail makes statements of kind return err without running; a nil err
// lets them run again.
func (f *FaultyDB) SetFail(kind string, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if err == nil {
		delete(f.fail, kind)
	} else {
		f.fail[kind] = err
	}
}

// Cut fails every statement from now on, as a crashed replica or a cut
// network would.
func (f *FaultyDB) Cut(err error) {
	for _, kind := range []string{"claim", "heartbeat", "release", "other"} {
		f.SetFail(kind, err)
	}
}

// Hold stops statements of kind before they are sent (each reported on
// Entered) until release is called.
func (f *FaultyDB) Hold(kind string) (release func()) {
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

func (f *FaultyDB) before(ctx context.Context, sql string) error {
	kind := StatementKind(sql)
	f.mu.Lock()
	err, gate := f.fail[kind], f.gate[kind]
	f.mu.Unlock()
	if err != nil {
		return err
	}
	if gate != nil {
		f.Entered <- kind
		select {
		case <-gate:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return nil
}

// Begin implements pglease.DB.
func (f *FaultyDB) Begin(ctx context.Context) (pgx.Tx, error) {
	if err := f.before(ctx, "BEGIN"); err != nil {
		return nil, err
	}
	return f.DB.Begin(ctx)
}

// Exec implements pglease.DB.
func (f *FaultyDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if err := f.before(ctx, sql); err != nil {
		return pgconn.CommandTag{}, err
	}
	return f.DB.Exec(ctx, sql, args...)
}

// Query implements pglease.DB.
func (f *FaultyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := f.before(ctx, sql); err != nil {
		return nil, err
	}
	return f.DB.Query(ctx, sql, args...)
}

// QueryRow implements pglease.DB.
func (f *FaultyDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	if err := f.before(ctx, sql); err != nil {
		return driver.ErrRow{Err: err}
	}
	return f.DB.QueryRow(ctx, sql, args...)
}
