package fakedriver

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease/internal/driver"
)

// Lock takes the row lock of key as another transaction would (an
// operator's open transaction, a guarded job's), until the returned
// function ends that transaction; calling it again does nothing. While the
// row is locked:
//
//   - a heartbeat skips it: a lease it still matches is reported Locked,
//     not extended;
//   - a release skips it: a lease it still matches is reported to be sent
//     again (false), not released. The real release of one lease first
//     waits driver.ReleaseLockWait for the lock; this one does not;
//   - a claim that would take it waits for the lock, for at most its lock
//     wait when it has one (then it fails with SQLSTATE 55P03, having
//     written nothing; a burst waits 1ms at least, as the real one does),
//     or until its context ends. The lock wait is counted in real time, as
//     lock_timeout counts it, not on the table's clock. A claim the row refuses
//     (another holder's live lease, or a tick not after the row's) is
//     refused at once, having only read it;
//   - a read of its lease is not held up.
//
// A key without a row has no row to lock: the lock holds nothing. Lock
// panics if the row is locked already (a second transaction would wait).
func (t *Table) Lock(key string) (unlock func()) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.rows[key]; !ok {
		return func() {}
	}
	if _, ok := t.locks[key]; ok {
		panic(fmt.Sprintf("fakedriver: the row of %q is locked already", key))
	}
	ended := make(chan struct{})
	t.locks[key] = ended
	var once sync.Once
	return func() {
		once.Do(func() {
			t.mu.Lock()
			delete(t.locks, key)
			t.mu.Unlock()
			close(ended)
		})
	}
}

// locked reports whether key's row is locked, with t.mu held.
func (t *Table) locked(key string) bool {
	_, ok := t.locks[key]
	return ok
}

// lockWaitError is what a statement returns, having written nothing, when it
// must wait for the row lock of key: its attempt waits out of the mutex,
// then runs it again.
type lockWaitError struct {
	key   string
	ended <-chan struct{}
	most  time.Duration // 0: as long as the lock is held
}

func (w *lockWaitError) Error() string { return fmt.Sprintf("waiting for the row lock of %q", w.key) }

// waitFor is the lockWaitError that waits for the row lock of key for at most
// most, with t.mu held; nil if the row is not locked.
func (t *Table) waitFor(key string, most time.Duration) *lockWaitError {
	ended, ok := t.locks[key]
	if !ok {
		return nil
	}
	return &lockWaitError{key: key, ended: ended, most: most}
}

// wait waits for the lock to end, for its lock wait, or for ctx, t.mu not
// held.
func (w *lockWaitError) wait(ctx context.Context, kind Kind) error {
	var timeout <-chan time.Time
	if w.most > 0 {
		timer := time.NewTimer(w.most)
		defer timer.Stop()
		timeout = timer.C
	}
	select {
	case <-w.ended:
		return nil
	case <-timeout:
		return &pgconn.PgError{Severity: "ERROR", Code: driver.LockNotAvailable, Message: "canceling statement due to lock timeout"}
	case <-ctx.Done():
		return fmt.Errorf("fakedriver: %s waiting for the row lock of %q: %w", kind, w.key, context.Cause(ctx))
	}
}
