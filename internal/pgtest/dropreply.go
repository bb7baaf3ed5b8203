package pgtest

import (
	"encoding/binary"
	"net"
	"sync"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
)

// DropReply loses the server's reply to the first statement of a kind
// written once armed: the statement runs to its end (its transaction
// committed or rolled back), and the client then reads a reset
// connection, as when the network fails between the commit and the reply.
// Install it with Dial as a pool's ConnConfig.DialFunc.
type DropReply struct {
	armed
	Dropped chan struct{} // closed once the reply was read to its end and dropped
}

// NewDropReply is a DropReply of statements of kind (StatementKind).
func NewDropReply(kind string) *DropReply {
	return &DropReply{armed: armed{kind: kind}, Dropped: make(chan struct{})}
}

// Dial wraps dial.
func (d *DropReply) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return wrapDial(dial, func(c net.Conn) net.Conn { return &dropConn{Conn: c, d: d} })
}

// ready reports whether b, the server's messages from the start of one,
// holds a whole ReadyForQuery: the statement's transaction has ended.
func ready(b []byte) bool {
	for len(b) >= 5 {
		n := int(binary.BigEndian.Uint32(b[1:5]))
		if len(b) < 1+n {
			return false
		}
		if b[0] == 'Z' {
			return true
		}
		b = b[1+n:]
	}
	return false
}

// dropConn is a connection of a DropReply.
type dropConn struct {
	net.Conn
	d        *DropReply
	mu       sync.Mutex
	dropping bool
}

func (c *dropConn) Write(b []byte) (int, error) {
	if c.d.take(b) {
		c.mu.Lock()
		c.dropping = true
		c.mu.Unlock()
	}
	return c.Conn.Write(b)
}

func (c *dropConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	dropping := c.dropping
	c.dropping = false
	c.mu.Unlock()
	if !dropping {
		return c.Conn.Read(p)
	}
	var reply []byte
	buf := make([]byte, 8192)
	for !ready(reply) {
		n, err := c.Conn.Read(buf)
		reply = append(reply, buf[:n]...)
		if err != nil {
			break
		}
	}
	_ = c.Close()
	close(c.d.Dropped)
	return 0, &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
}
