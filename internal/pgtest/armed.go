package pgtest

import (
	"bytes"
	"context"
	"encoding/binary"
	"net"
	"sync"

	"github.com/jackc/pgx/v5/pgconn"
)

// armed picks, once armed, the first write that carries a statement of a
// kind: what HoldSend holds, DropReply answers for and FailSend fails.
type armed struct {
	kind string
	mu   sync.Mutex
	on   bool
}

// Arm picks the next write of a statement of the kind.
func (a *armed) Arm() {
	a.mu.Lock()
	a.on = true
	a.mu.Unlock()
}

// take reports whether the write b carries the armed statement, disarming a.
func (a *armed) take(b []byte) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	if !a.on || !carries(b, a.kind) {
		return false
	}
	a.on = false
	return true
}

// carries reports whether b, the messages of one write, holds a Parse or
// a Query message of a statement of kind.
func carries(b []byte, kind string) bool {
	for len(b) >= 5 {
		typ, n := b[0], int(binary.BigEndian.Uint32(b[1:5]))
		if n < 4 || len(b) < 1+n {
			return false
		}
		body := b[5 : 1+n]
		switch typ {
		case 'P': // Parse: name, then the statement's text
			if i := bytes.IndexByte(body, 0); i >= 0 {
				body = body[i+1:]
			}
			fallthrough
		case 'Q': // Query: the statement's text
			if i := bytes.IndexByte(body, 0); i >= 0 && StatementKind(string(body[:i])) == kind {
				return true
			}
		}
		b = b[1+n:]
	}
	return false
}

// wrapDial is dial, each connection it makes wrapped by wrap.
func wrapDial(dial pgconn.DialFunc, wrap func(net.Conn) net.Conn) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return wrap(c), nil
	}
}
