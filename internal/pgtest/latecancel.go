package pgtest

import (
	"context"
	"encoding/binary"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"
)

// LateCancelConfig is a connection config for dsn whose cancel requests
// reach the server only delay after they are sent, as over a path that
// lost a segment and retransmits it: the request's write returns at once,
// closing its connection does not recall it, and the server's answer (it
// closes the request's connection) comes only once it landed. landed
// counts the requests delivered. The test waits, as it ends, for every
// delayed write and close.
func LateCancelConfig(tb testing.TB, dsn string, delay time.Duration) (cfg *pgx.ConnConfig, landed *atomic.Int64) {
	tb.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(tb, err)
	landed = new(atomic.Int64)
	var late sync.WaitGroup
	tb.Cleanup(late.Wait)
	dial := cfg.DialFunc
	cfg.DialFunc = func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lateCancelConn{Conn: c, delay: delay, landed: landed, late: &late}, nil
	}
	return cfg, landed
}

// lateCancelConn delays the 16-byte CancelRequest packet written on it.
type lateCancelConn struct {
	net.Conn
	delay  time.Duration
	landed *atomic.Int64
	late   *sync.WaitGroup
	mu     sync.Mutex
	queued chan struct{} // closed once the delayed write was made
}

// cancelRequestCode is the protocol's code of a CancelRequest.
const cancelRequestCode = 80877102

func (c *lateCancelConn) Write(b []byte) (int, error) {
	if len(b) != 16 || binary.BigEndian.Uint32(b[0:4]) != 16 || binary.BigEndian.Uint32(b[4:8]) != cancelRequestCode {
		return c.Conn.Write(b)
	}
	buf := append([]byte(nil), b...)
	q := make(chan struct{})
	c.mu.Lock()
	c.queued = q
	c.mu.Unlock()
	c.late.Add(1)
	go func() {
		defer c.late.Done()
		defer close(q)
		time.Sleep(c.delay)
		_ = c.Conn.SetWriteDeadline(time.Time{})
		if _, err := c.Conn.Write(buf); err == nil {
			c.landed.Add(1)
		}
	}()
	return len(b), nil
}

// Close closes the connection once a delayed request was written: the
// kernel would deliver what it buffered before the close.
func (c *lateCancelConn) Close() error {
	c.mu.Lock()
	q := c.queued
	c.mu.Unlock()
	if q == nil {
		return c.Conn.Close()
	}
	c.late.Add(1)
	go func() {
		defer c.late.Done()
		<-q
		time.Sleep(200 * time.Millisecond)
		_ = c.Conn.Close()
	}()
	return nil
}
