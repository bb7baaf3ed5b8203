package pglease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// channel is the channel the release statement notifies the released keys
// on: "pglease:" and the table's name as given to WithTable, cut to fit
// (sqlstmt.Channel). Lockers wake each other only if they name the table
// the same way ("lease" and "public.lease" are two channels); a waiter
// that misses a notification still wakes at its backoff and at the
// holder's expiry.
func (t table) channel() string { return sqlstmt.Channel(t.String()) }

// WaitMode says how a Locker's waiting claims learn that a key was
// released.
type WaitMode int

const (
	// WaitIdle means no claim of the Locker has waited yet.
	WaitIdle WaitMode = iota
	// WaitByNotification means a connection of the Locker LISTENs on the table's
	// channel and the release statement notifies it: waiters wake within a
	// round trip of a release.
	WaitByNotification
	// WaitByPolling means waiters try again after a backoff (at most
	// maxPollBackoff) or at the holder's expiry, whichever comes first.
	WaitByPolling
)

func (m WaitMode) String() string {
	switch m {
	case WaitByNotification:
		return "notification"
	case WaitByPolling:
		return "polling"
	}
	return "idle"
}

// WaitMode says how this Locker's waiting claims wake up, and why when
// they poll.
func (l *Locker) WaitMode() (WaitMode, string) {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode, w.reason
}

const (
	// probeTimeout bounds the wait for the probe notification after LISTEN.
	// PgBouncer in transaction pooling mode accepts LISTEN, but the
	// notification goes to a server connection no client listens on.
	probeTimeout = 2 * time.Second
	// minRelisten and maxRelisten bound the pause before LISTEN is tried
	// again after the listening connection failed.
	minRelisten = 100 * time.Millisecond
	maxRelisten = 30 * time.Second
	// probePrefix starts the payload of a probe notification. A key of that
	// shape only gets a spurious wake-up.
	probePrefix = "pglease-probe:"
)

// errNoDelivery is the cause of polling when LISTEN works but nothing is
// delivered: it will not change, so LISTEN is not tried again.
var errNoDelivery = errors.New("LISTEN was accepted but the probe notification did not arrive")

// listen runs the Locker's listener until ctx ends: one connection, taken
// from the pool and owned by the Locker from then on (hijacked, so that the
// pool's Close does not wait for it), LISTENing on the table's channel. A
// probe checks that notifications arrive; if they do not, waiters poll. A
// broken connection is replaced; after every (re)LISTEN each waiter tries
// once, since a release may have been notified while nobody listened.
func (l *Locker) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	ch := l.waits.table.channel()
	pause := minRelisten
	for {
		conn, err := l.listenConn(ctx, ch)
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		if err != nil {
			l.setWaitMode(WaitByPolling, err.Error())
			if errors.Is(err, errNoDelivery) {
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(pause):
			}
			pause = min(2*pause, maxRelisten)
			continue
		}
		l.waits.mu.Lock()
		l.waits.pid = conn.PgConn().PID()
		l.waits.mu.Unlock()
		l.setWaitMode(WaitByNotification, "")
		l.waits.wakeAll()
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() == nil {
					l.setWaitMode(WaitByPolling, fmt.Sprintf("the listening connection failed (%v); listening again", err))
				}
				break
			}
			l.waits.wake(n.Payload)
		}
		closeConn(conn)
		pause = minRelisten
	}
}

// listenConn takes a connection out of the pool, LISTENs on ch, and checks
// with a probe sent on another connection that notifications arrive.
func (l *Locker) listenConn(ctx context.Context, ch string) (*pgx.Conn, error) {
	pc, err := l.conns.pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("no connection to LISTEN on: %w", err)
	}
	conn := pc.Hijack()
	if _, err := conn.Exec(ctx, l.waits.table.render(sqlstmt.Listen)); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("LISTEN %q failed: %w", ch, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	probe := probePrefix + hex.EncodeToString(b[:])
	sender, err := l.conns.pool.Acquire(ctx)
	if err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("no connection to send the probe notification on: %w", err)
	}
	_, err = sender.Exec(ctx, sqlstmt.Probe, ch, probe)
	sender.Release()
	if err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("sending the probe notification: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(pctx)
		switch {
		case ctx.Err() != nil:
			return conn, ctx.Err()
		case pctx.Err() != nil:
			closeConn(conn)
			return nil, fmt.Errorf("%w within %v (a pooler in transaction mode, such as PgBouncer, drops notifications)", errNoDelivery, probeTimeout)
		case err != nil:
			closeConn(conn)
			return nil, fmt.Errorf("waiting for the probe notification: %w", err)
		case n.Payload == probe:
			return conn, nil
		}
		l.waits.wake(n.Payload)
	}
}

func closeConn(conn *pgx.Conn) {
	if conn == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	_ = conn.Close(ctx)
}

// setWaitMode records how waiters wake and reports a change.
func (l *Locker) setWaitMode(m WaitMode, reason string) {
	w := &l.waits
	w.mu.Lock()
	changed := w.mode != m || w.reason != reason
	w.mode, w.reason = m, reason
	w.mu.Unlock()
	if !changed {
		return
	}
	if m == WaitByNotification {
		l.emit(Event{Kind: EventWaitByNotification})
		return
	}
	l.emit(Event{Kind: EventWaitByPolling, Err: errors.New(reason)})
}
