package pgtest

import (
	"net"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// FailSend fails, once armed, the first write that carries a statement of
// a kind: nothing of it reaches the server, and the connection is reset,
// as when the network fails under the write. Install it with Dial as a
// pool's ConnConfig.DialFunc.
type FailSend struct {
	armed
	Failed chan struct{} // closed once the write failed
}

// NewFailSend is a FailSend of statements of kind (StatementKind).
func NewFailSend(kind string) *FailSend {
	return &FailSend{armed: armed{kind: kind}, Failed: make(chan struct{})}
}

// Dial wraps dial.
func (f *FailSend) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return wrapDial(dial, func(c net.Conn) net.Conn { return &failConn{Conn: c, f: f} })
}

// failConn is a connection of a FailSend.
type failConn struct {
	net.Conn
	f *FailSend
}

func (c *failConn) Write(b []byte) (int, error) {
	if c.f.take(b) {
		close(c.f.Failed)
		_ = c.Close()
		return 0, &net.OpError{Op: "write", Net: "tcp", Err: syscall.ECONNRESET}
	}
	return c.Conn.Write(b)
}
