// Package listen keeps one connection LISTENing on a channel for as long
// as it is asked to, and says whether notifications arrive.
//
// What a Listener guarantees:
//
//   - Before it reports that notifications arrive (Ready), a probe sent on
//     another connection has come back on the listening one: a pooler in
//     transaction mode (PgBouncer) accepts LISTEN but delivers nothing.
//   - Every notification received after Ready, and any received while it
//     waits for the probe, goes to Notify, in order; the probe does not.
//   - A connection that fails is reported (Polling) and replaced after a
//     pause that doubles from 100ms up to 30s; Ready is reported again
//     once the new one listens, so that the caller can retry whatever a
//     notification sent meanwhile would have woken.
//   - A probe that does not come back is reported once, with
//     ErrNoDelivery, and Run returns: it would not come back next time
//     either.
//   - The listening connection is the Listener's own (hijacked from the
//     pool, so that the pool's Close does not wait for it, or dialed on a
//     configuration of its own) and is closed before Run returns.
package listen

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
)

const (
	// DefaultProbeTimeout bounds the wait for the probe notification after
	// LISTEN.
	DefaultProbeTimeout = 2 * time.Second
	// minRelisten and maxRelisten bound the pause before LISTEN is tried
	// again after the listening connection failed.
	minRelisten = 100 * time.Millisecond
	maxRelisten = 30 * time.Second
	// ProbePrefix starts the payload of a probe notification. A payload of
	// that shape sent by anyone else only gets a spurious Notify.
	ProbePrefix = "pglease-probe:"
)

// ErrNoDelivery is the cause of Polling when LISTEN works but nothing is
// delivered: it will not change, so LISTEN is not tried again.
var ErrNoDelivery = errors.New("LISTEN was accepted but the probe notification did not arrive")

// Pool is where a Listener takes its connections: *pgxpool.Pool.
type Pool interface {
	Acquire(ctx context.Context) (*pgxpool.Conn, error)
}

// Source gives a Listener the connection it listens on and sends its
// probes on another one.
type Source interface {
	// Conn returns a connection the Listener owns from then on, and closes.
	Conn(ctx context.Context) (*pgx.Conn, error)
	// Exec runs one statement on another connection than Conn's: the way
	// the notifications to receive are sent.
	Exec(ctx context.Context, sql string, args ...any) error
}

// PoolSource listens on a connection hijacked from Pool, and sends probes
// on another connection of it.
type PoolSource struct{ Pool Pool }

// Conn takes a connection out of the pool for good.
func (p PoolSource) Conn(ctx context.Context) (*pgx.Conn, error) {
	pc, err := p.Pool.Acquire(ctx)
	if err != nil {
		return nil, fmt.Errorf("no connection to LISTEN on: %w", err)
	}
	return pc.Hijack(), nil
}

// Exec runs sql on a connection of the pool, given back after.
func (p PoolSource) Exec(ctx context.Context, sql string, args ...any) error {
	pc, err := p.Pool.Acquire(ctx)
	if err != nil {
		return fmt.Errorf("no connection to send the probe notification on: %w", err)
	}
	defer pc.Release()
	_, err = pc.Exec(ctx, sql, args...)
	return err
}

// DialSource listens on a connection it dials with Config, of its own:
// a direct connection to the server beside a pooler that drops
// notifications. Probes go through Send, the way releases are sent (the
// pooler), so that Ready means that those reach the listening connection.
type DialSource struct {
	Config *pgx.ConnConfig
	Send   func(ctx context.Context, sql string, args ...any) error
}

// Conn dials a new connection with Config.
func (d DialSource) Conn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := pgx.ConnectConfig(ctx, d.Config)
	if err != nil {
		return nil, fmt.Errorf("no connection to LISTEN on (dialing %s:%d): %w", d.Config.Host, d.Config.Port, err)
	}
	return conn, nil
}

// Exec sends sql with Send.
func (d DialSource) Exec(ctx context.Context, sql string, args ...any) error {
	return d.Send(ctx, sql, args...)
}

// Listener LISTENs on Channel with connections of Source. Its fields are set
// before Run and not changed after.
type Listener struct {
	Source Source
	// Listen is the statement that LISTENs on Channel.
	Listen string
	// Probe sends a notification on channel $1 with payload $2.
	Probe   string
	Channel string
	// ProbeTimeout bounds the wait for the probe; 0 is
	// DefaultProbeTimeout.
	ProbeTimeout time.Duration

	// Notify gets the payload of each notification.
	Notify func(payload string)
	// Ready says that notifications arrive, on the connection of backend
	// pid.
	Ready func(pid uint32)
	// Polling says that notifications do not arrive, and why.
	Polling func(reason error)
}

// Run listens until ctx ends, or until notifications are found not to be
// delivered at all (ErrNoDelivery).
func (l *Listener) Run(ctx context.Context) {
	pause := minRelisten
	for {
		conn, err := l.conn(ctx)
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		if err != nil {
			l.Polling(err)
			if errors.Is(err, ErrNoDelivery) {
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
		l.Ready(conn.PgConn().PID())
		for {
			n, err := conn.WaitForNotification(ctx)
			if err != nil {
				if ctx.Err() == nil {
					l.Polling(fmt.Errorf("the listening connection failed (%w); listening again", err))
				}
				break
			}
			l.Notify(n.Payload)
		}
		closeConn(conn)
		pause = minRelisten
	}
}

// conn takes a connection from the source, LISTENs on it, and checks with
// a probe sent on another connection that notifications arrive.
func (l *Listener) conn(ctx context.Context) (*pgx.Conn, error) {
	conn, err := l.Source.Conn(ctx)
	if err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, l.Listen); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("LISTEN %q failed: %w", l.Channel, err)
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	probe := ProbePrefix + hex.EncodeToString(b[:])
	if err := l.Source.Exec(ctx, l.Probe, l.Channel, probe); err != nil {
		closeConn(conn)
		return nil, fmt.Errorf("sending the probe notification: %w", err)
	}
	timeout := l.ProbeTimeout
	if timeout == 0 {
		timeout = DefaultProbeTimeout
	}
	pctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		n, err := conn.WaitForNotification(pctx)
		switch {
		case ctx.Err() != nil:
			return conn, ctx.Err()
		case pctx.Err() != nil:
			closeConn(conn)
			return nil, fmt.Errorf("%w within %v (a pooler in transaction mode, such as PgBouncer, drops notifications)", ErrNoDelivery, timeout)
		case err != nil:
			closeConn(conn)
			return nil, fmt.Errorf("waiting for the probe notification: %w", err)
		case n.Payload == probe:
			return conn, nil
		}
		l.Notify(n.Payload)
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
