package pgtest

import (
	"context"
	"net"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// FailSend fails, once armed, the first write that carries a statement of
// a kind: nothing of it reaches the server, and the connection is reset,
// as when the network fails under the write. Install it with Dial as a
// pool's ConnConfig.DialFunc.
type FailSend struct {
	kind   string
	mu     sync.Mutex
	armed  bool
	Failed chan struct{} // closed once the write failed
}

// NewFailSend is a FailSend of statements of kind (StatementKind).
func NewFailSend(kind string) *FailSend {
	return &FailSend{kind: kind, Failed: make(chan struct{})}
}

// Arm fails the next write of a statement of f's kind.
func (f *FailSend) Arm() {
	f.mu.Lock()
	f.armed = true
	f.mu.Unlock()
}

// Dial wraps dial.
func (f *FailSend) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &failConn{Conn: c, f: f}, nil
	}
}

// take reports whether the write b carries the armed statement, disarming f.
func (f *FailSend) take(b []byte) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	if !f.armed || !carries(b, f.kind) {
		return false
	}
	f.armed = false
	close(f.Failed)
	return true
}

// failConn is a connection of a FailSend.
type failConn struct {
	net.Conn
	f *FailSend
}

func (c *failConn) Write(b []byte) (int, error) {
	if c.f.take(b) {
		_ = c.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return c.Conn.Write(b)
}
