package pgtest

import (
	"bytes"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgconn"
)

// HoldSend holds back, on the one connection that writes the first
// statement of a kind once armed, that write and every byte after it, and
// the connection's close, until Deliver: the client sees its write succeed,
// and the server receives the statement, and begins it, only then. Install
// it with Dial as a pool's ConnConfig.DialFunc.
type HoldSend struct {
	armed
	Held    chan struct{} // closed once the statement's bytes are held
	deliver chan struct{}
	Done    chan struct{} // closed once the held bytes are written, and the connection closed if the client closed it
	once    sync.Once
}

// NewHoldSend is a HoldSend of statements of kind (StatementKind),
// delivered at the latest when tb ends.
func NewHoldSend(tb testing.TB, kind string) *HoldSend {
	tb.Helper()
	h := &HoldSend{armed: armed{kind: kind}, Held: make(chan struct{}), deliver: make(chan struct{}), Done: make(chan struct{})}
	tb.Cleanup(h.Deliver)
	return h
}

// Deliver writes what is held.
func (h *HoldSend) Deliver() { h.once.Do(func() { close(h.deliver) }) }

// Dial wraps dial.
func (h *HoldSend) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return wrapDial(dial, func(c net.Conn) net.Conn { return &holdConn{Conn: c, h: h} })
}

// holdConn is a connection of a HoldSend.
type holdConn struct {
	net.Conn
	h       *HoldSend
	mu      sync.Mutex
	holding bool
	buf     bytes.Buffer
	closed  bool // closed by the client while holding
}

func (c *holdConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	if !c.holding && c.h.take(b) {
		c.holding = true
		close(c.h.Held)
		go c.release()
	}
	if c.holding {
		defer c.mu.Unlock()
		return c.buf.Write(b)
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// release writes what was held once delivered, then closes the connection
// if the client closed it meanwhile.
func (c *holdConn) release() {
	defer close(c.h.Done)
	<-c.h.deliver
	c.mu.Lock()
	// Whatever deadline the client set meanwhile (pgx's clean-up of a
	// statement it gave up on sets one): bytes the kernel was given, or a
	// router queued, still reach the server.
	_ = c.SetWriteDeadline(time.Time{})
	_, _ = c.Conn.Write(c.buf.Bytes())
	c.buf.Reset()
	c.holding = false
	closed := c.closed
	c.mu.Unlock()
	if closed {
		// The server runs a statement it read whole, whether or not the
		// connection then ends: the pause only lets it read the statement
		// before the end, as it would have read it before the close.
		time.Sleep(200 * time.Millisecond)
		_ = c.Conn.Close()
	}
}

func (c *holdConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.holding {
		c.closed = true
		return nil
	}
	return c.Conn.Close()
}
