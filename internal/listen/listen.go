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
//   - A connection that stays silent for CheckInterval is pinged, and one
//     that does not answer within CheckTimeout counts as failed: a
//     half-open connection (a partition, a dead NAT entry) is noticed
//     within CheckInterval+CheckTimeout of its last sign of life, not
//     never.
//   - A connection's setup (its dial, LISTEN, the sending of its probe)
//     that takes over SetupTimeout counts as failed: a dial that hangs is
//     tried again.
//   - A connection that fails is reported (Polling) before anything else
//     is done with it, and replaced after a pause that doubles from 100ms
//     up to 30s (Redial); the pauses start over only after a connection
//     that listened for 10s, so that a server that ends every connection
//     soon after LISTEN is not dialed in a loop. Ready is reported again
//     once the new one listens.
//   - A probe that does not come back is reported with ErrNoDelivery, and
//     LISTEN is tried again after a pause that doubles from 5s up to 5
//     minutes: the link may have been slow for a moment, while a pooler
//     that drops notifications costs one probe per pause.
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

	"github.com/pglease/pglease/internal/driver"
)

const (
	// DefaultProbeTimeout bounds the wait for the probe notification after
	// LISTEN.
	DefaultProbeTimeout = 2 * time.Second
	// DefaultCheckInterval is how long a listening connection may stay
	// silent before it is pinged.
	DefaultCheckInterval = 500 * time.Millisecond
	// DefaultCheckTimeout is how long the ping may take: with
	// DefaultCheckInterval, a dead connection is noticed within 1.5s,
	// about the time a polling waiter takes to see a release.
	DefaultCheckTimeout = time.Second
	// DefaultSetupTimeout bounds the dial (or the wait for a pool's
	// connection), the LISTEN and the sending of the probe: a dial that
	// hangs (a stalled link, no connect_timeout) is tried again, so that
	// the Listener listens again once the network heals.
	DefaultSetupTimeout = 10 * time.Second
	// ProbePrefix starts the payload of a probe notification. A payload of
	// that shape sent by anyone else only gets a spurious Notify.
	ProbePrefix = "pglease-probe:"
)

// ErrNoDelivery is the cause of Polling when LISTEN works but the probe
// did not come back in time: the connection does not hear what is sent
// through the DB (a pooler in transaction mode, another server or
// database), or hears it late (a slow or stalled link).
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
// through Send, the way releases are sent: a probe given up in flight
// leaves its connection closed there, never back in the pool with a cancel
// request on its way to whatever that connection runs next.
type PoolSource struct {
	Pool Pool
	Send func(ctx context.Context, sql string, args ...any) error
}

// Conn takes a connection out of the pool for good, waiting for it no
// longer than ctx but without its deadline (driver.NoDeadline).
func (p PoolSource) Conn(ctx context.Context) (*pgx.Conn, error) {
	pc, err := p.Pool.Acquire(driver.NoDeadline(ctx))
	if err != nil {
		return nil, fmt.Errorf("no connection to LISTEN on: %w", err)
	}
	return pc.Hijack(), nil
}

// Exec sends sql through Send.
func (p PoolSource) Exec(ctx context.Context, sql string, args ...any) error {
	return p.Send(ctx, sql, args...)
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
	// CheckInterval is the silence after which the connection is pinged,
	// CheckTimeout the time the ping may take; 0 is DefaultCheckInterval,
	// DefaultCheckTimeout.
	CheckInterval, CheckTimeout time.Duration
	// SetupTimeout bounds a connection's setup, up to the sending of its
	// probe; 0 is DefaultSetupTimeout.
	SetupTimeout time.Duration

	// Notify gets the payload of each notification.
	Notify func(payload string)
	// Ready says that notifications arrive, on the connection of backend
	// pid.
	Ready func(pid uint32)
	// Polling says that notifications do not arrive, and why.
	Polling func(reason error)
}

// Run listens until ctx ends.
func (l *Listener) Run(ctx context.Context) {
	var redial Redial
	for {
		conn, err := l.conn(ctx)
		if ctx.Err() != nil {
			closeConn(conn)
			return
		}
		var pause time.Duration
		if err != nil {
			l.Polling(err)
			pause = redial.Failed(0, errors.Is(err, ErrNoDelivery))
		} else {
			redial.Delivered()
			since := time.Now()
			l.Ready(conn.PgConn().PID())
			err := l.listen(ctx, conn)
			if ctx.Err() == nil {
				l.Polling(fmt.Errorf("%w; listening again", err))
			}
			closeConn(conn)
			pause = redial.Failed(time.Since(since), false)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(pause):
		}
	}
}

// listen hands the notifications of conn to Notify until conn fails, or
// stays silent for CheckInterval and does not answer a ping within
// CheckTimeout, or ctx ends.
func (l *Listener) listen(ctx context.Context, conn *pgx.Conn) error {
	interval, timeout := l.CheckInterval, l.CheckTimeout
	if interval <= 0 {
		interval = DefaultCheckInterval
	}
	if timeout <= 0 {
		timeout = DefaultCheckTimeout
	}
	for {
		// A wait that times out leaves the connection usable (pgconn
		// closes it on any other error only).
		wctx, cancel := context.WithTimeout(ctx, interval)
		n, err := conn.WaitForNotification(wctx)
		silent := wctx.Err() != nil
		cancel()
		switch {
		case err == nil:
			l.Notify(n.Payload)
			continue
		case ctx.Err() != nil:
			return ctx.Err()
		case !silent:
			return fmt.Errorf("the listening connection failed (%w)", err)
		}
		pctx, cancel := context.WithTimeout(ctx, timeout)
		err = conn.Ping(pctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case err != nil:
			return fmt.Errorf("the listening connection did not answer a ping within %v (%w)", timeout, err)
		}
	}
}

// conn takes a connection from the source, LISTENs on it, and checks with
// a probe sent on another connection that notifications arrive.
func (l *Listener) conn(ctx context.Context) (*pgx.Conn, error) {
	setup := l.SetupTimeout
	if setup <= 0 {
		setup = DefaultSetupTimeout
	}
	sctx, cancel := context.WithTimeout(ctx, setup)
	defer cancel()
	gaveUp := func(err error) error {
		if sctx.Err() != nil && ctx.Err() == nil {
			return fmt.Errorf("%w (gave up after %v)", err, setup)
		}
		return err
	}
	conn, err := l.Source.Conn(sctx)
	if err != nil {
		return nil, gaveUp(err)
	}
	if _, err := conn.Exec(sctx, l.Listen); err != nil {
		closeConn(conn)
		return nil, gaveUp(fmt.Errorf("LISTEN %q failed: %w", l.Channel, err))
	}
	var b [8]byte
	_, _ = rand.Read(b[:])
	probe := ProbePrefix + hex.EncodeToString(b[:])
	if err := l.Source.Exec(sctx, l.Probe, l.Channel, probe); err != nil {
		closeConn(conn)
		return nil, gaveUp(fmt.Errorf("sending the probe notification: %w", err))
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
			return nil, fmt.Errorf("%w within %v: this connection does not hear what is sent through the DB (a pooler in transaction mode such as PgBouncer, another server or database) or hears it late (a slow or stalled link); LISTEN is tried again after a pause that doubles from %v up to %v", ErrNoDelivery, timeout, minReprobe, maxReprobe)
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
