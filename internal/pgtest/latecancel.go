package pgtest

import (
	"context"
	"encoding/binary"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"
)

// LateCancel makes the connections it dials carry their cancel requests
// to the server only some time after they are sent, as over a path that
// lost a segment and retransmits it: the request's write returns at once,
// closing its connection does not recall it, and the server's answer (it
// closes the request's connection) comes only once it landed. It can
// also hold back the next reply of the server. The test waits, as it
// ends, for every delayed write and close.
type LateCancel struct {
	delay      time.Duration
	replyDelay atomic.Int64
	tillCancel atomic.Bool   // the delay ends once a cancel request was written
	held       chan struct{} // a reply DelayNextReplyOf holds back arrived
	sent       atomic.Int64
	landed     atomic.Int64
	late       sync.WaitGroup
}

// NewLateCancel is a LateCancel whose cancel requests land delay after
// they are sent.
func NewLateCancel(tb testing.TB, delay time.Duration) *LateCancel {
	tb.Helper()
	l := &LateCancel{delay: delay, held: make(chan struct{}, 1)}
	tb.Cleanup(l.late.Wait)
	return l
}

// LateCancelConfig is a connection config for dsn dialled through a
// LateCancel of delay.
func LateCancelConfig(tb testing.TB, dsn string, delay time.Duration) (*pgx.ConnConfig, *LateCancel) {
	tb.Helper()
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(tb, err)
	l := NewLateCancel(tb, delay)
	cfg.DialFunc = l.Dial(cfg.DialFunc)
	return cfg, l
}

// Pool is a CancelRequestPool on dsn of maxConns connections dialled
// through l, which never pings a connection it hands out (so that a late
// request finds the next statement), and the count of the server's
// WARNINGs that a cancel request cut a commit's wait for a synchronous
// standby.
func (l *LateCancel) Pool(tb testing.TB, dsn string, maxConns int32) (*pgxpool.Pool, *atomic.Int64) {
	tb.Helper()
	var cut *atomic.Int64
	p := CancelRequestPool(tb, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = maxConns
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
		cfg.ConnConfig.DialFunc = l.Dial(cfg.ConnConfig.DialFunc)
		cut = CountCutWaits(&cfg.ConnConfig.Config)
	})
	return p, cut
}

// CountCutWaits counts, on the connections of cfg, the server's WARNINGs
// that a cancel request cut a commit's wait for a synchronous standby.
func CountCutWaits(cfg *pgconn.Config) *atomic.Int64 {
	cut := new(atomic.Int64)
	cfg.OnNotice = func(_ *pgconn.PgConn, n *pgconn.Notice) {
		if strings.Contains(n.Message, "canceling wait for synchronous replication") {
			cut.Add(1)
		}
	}
	return cut
}

// Dial wraps dial.
func (l *LateCancel) Dial(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return &lateCancelConn{Conn: c, l: l}, nil
	}
}

// Sent is how many cancel requests were written by the client (held
// back or not yet).
func (l *LateCancel) Sent() int64 { return l.sent.Load() }

// Landed is how many cancel requests were delivered.
func (l *LateCancel) Landed() int64 { return l.landed.Load() }

// DelayNextReply holds back the next read of any connection dialled by l
// for d.
func (l *LateCancel) DelayNextReply(d time.Duration) { l.replyDelay.Store(int64(d)) }

// DelayNextReplyTillCancel holds back the next read of any connection
// dialled by l until a cancel request was written, for at most d: the
// reply comes after the statement's context ended, and at once.
func (l *LateCancel) DelayNextReplyTillCancel(d time.Duration) {
	l.tillCancel.Store(true)
	l.replyDelay.Store(int64(d))
}

// ReplyHeld receives once a read that DelayNextReply or DelayNextReplyOf
// holds back has begun: its statement is in flight, sent (and, held by
// DelayNextReplyOf, answered), until the delay ends.
func (l *LateCancel) ReplyHeld() <-chan struct{} { return l.held }

// DelayNextReplyOf holds back what conn reads next for d, when l dialled
// it (the next read of any connection of l otherwise): a statement's
// reply, not the read of another connection that happens to come first.
func (l *LateCancel) DelayNextReplyOf(conn *pgx.Conn, d time.Duration) {
	if c, ok := conn.PgConn().Conn().(*lateCancelConn); ok {
		c.replyDelay.Store(int64(d))
		return
	}
	l.DelayNextReply(d)
}

// AfterLanded calls then once a cancel request of l has landed and wait
// more, at once when ctx ends, or after 10 s when none landed, so that a
// test's next step waits for the request its case is built on rather
// than for a fixed time. The channel closes once then returned.
func (l *LateCancel) AfterLanded(ctx context.Context, wait time.Duration, then func()) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		defer close(done)
		defer then()
		bound := time.NewTimer(10 * time.Second)
		defer bound.Stop()
		poll := time.NewTicker(10 * time.Millisecond)
		defer poll.Stop()
		for l.Landed() == 0 {
			select {
			case <-bound.C:
				return
			case <-ctx.Done():
				return
			case <-poll.C:
			}
		}
		after := time.NewTimer(wait)
		defer after.Stop()
		select {
		case <-after.C:
		case <-ctx.Done():
		}
	}()
	return done
}

// lateCancelConn delays the 16-byte CancelRequest packet written on it.
type lateCancelConn struct {
	net.Conn
	l          *LateCancel
	replyDelay atomic.Int64 // DelayNextReplyOf
	mu         sync.Mutex
	queued     chan struct{} // closed once the delayed write was made
}

// cancelRequestCode is the protocol's code of a CancelRequest.
const cancelRequestCode = 80877102

func (c *lateCancelConn) Read(b []byte) (int, error) {
	if d := c.l.replyDelay.Swap(0); d > 0 {
		c.l.hold(time.Duration(d))
	}
	n, err := c.Conn.Read(b)
	// Held back after the read, so that a read already waiting (pgx's
	// background reader) when the delay was asked holds the reply too.
	if d := c.replyDelay.Swap(0); d > 0 {
		c.l.hold(time.Duration(d))
	}
	return n, err
}

// hold holds a read back for d, or till a cancel request was written
// (DelayNextReplyTillCancel), and says so on ReplyHeld.
func (l *LateCancel) hold(d time.Duration) {
	select {
	case l.held <- struct{}{}:
	default:
	}
	if !l.tillCancel.Swap(false) {
		time.Sleep(d)
		return
	}
	for end := time.Now().Add(d); l.sent.Load() == 0 && time.Now().Before(end); {
		time.Sleep(time.Millisecond)
	}
}

func (c *lateCancelConn) Write(b []byte) (int, error) {
	if len(b) != 16 || binary.BigEndian.Uint32(b[0:4]) != 16 || binary.BigEndian.Uint32(b[4:8]) != cancelRequestCode {
		return c.Conn.Write(b)
	}
	c.l.sent.Add(1)
	buf := append([]byte(nil), b...)
	q := make(chan struct{})
	c.mu.Lock()
	c.queued = q
	c.mu.Unlock()
	c.l.late.Add(1)
	go func() {
		defer c.l.late.Done()
		defer close(q)
		time.Sleep(c.l.delay)
		_ = c.SetWriteDeadline(time.Time{})
		if _, err := c.Conn.Write(buf); err == nil {
			c.l.landed.Add(1)
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
	c.l.late.Add(1)
	go func() {
		defer c.l.late.Done()
		<-q
		time.Sleep(200 * time.Millisecond)
		_ = c.Conn.Close()
	}()
	return nil
}
