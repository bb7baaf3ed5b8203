// Package faultproxy is a TCP proxy for tests that puts network faults
// between a client and a PostgreSQL server on the same machine: latency with
// jitter, a blackhole that accepts bytes and forwards nothing while the
// connections stay open, a stall that holds bytes and delivers them late,
// connection resets (RST), and the proxy itself going down and coming back
// on the same address.
//
// It exists because the faults the reliability tests need are not all
// available from github.com/Shopify/toxiproxy/v2 (v2.5.0, the version the
// module proxy serves) run in-process:
//
//   - removing its "timeout" toxic (its blackhole) closes the connections,
//     so a partition cannot heal with the connections still open, and it
//     leaves a goroutine blocked in NoopToxic.Pipe, which the package's
//     goleak check in TestMain reports;
//   - it has no way to hold bytes and deliver them once the network heals,
//     which is how a paused process or a congested link sends a heartbeat
//     that arrives after the lease was taken over;
//   - its reset_peer toxic only sets SO_LINGER 0 on connections opened after
//     the toxic is added, so existing connections get a FIN, not an RST.
//
// Everything is bounded and local: the proxy listens on 127.0.0.1 only,
// refuses a non-loopback upstream, and every goroutine it starts ends by
// Close.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"net"
	"sync"
	"time"
)

// Mode is what the proxy does with the bytes it reads.
type Mode int

const (
	// Forward passes bytes through, after the configured latency.
	Forward Mode = iota
	// Blackhole reads bytes and drops them; connections stay open and new
	// ones are accepted, as through a router that silently drops packets.
	Blackhole
	// Stall stops forwarding and keeps the bytes already read; they are
	// delivered, in order, when the mode goes back to Forward. The peer's
	// own writes back up in its socket buffers, as over a congested link or
	// from a process that is paused.
	Stall
)

// chunkSize is the read buffer of one direction of one connection.
const chunkSize = 32 << 10

// Stats counts what the proxy did, for reports.
type Stats struct {
	Accepted     int   // connections accepted
	Resets       int   // connections reset by ResetAll or Stop
	DroppedBytes int64 // bytes dropped by Blackhole
	LateBytes    int64 // bytes held by Stall and delivered afterwards
}

// Proxy forwards TCP connections from a loopback address to upstream.
type Proxy struct {
	upstream string
	addr     string

	mu      sync.Mutex
	ln      net.Listener // nil while stopped
	conns   map[*pair]struct{}
	mode    Mode
	healed  chan struct{} // closed when the mode leaves Stall
	latency time.Duration
	jitter  time.Duration
	rnd     *rand.Rand
	stats   Stats
	closed  bool
	done    chan struct{} // closed by Close: ends every wait
	wg      sync.WaitGroup
}

// pair is one proxied connection: client side and upstream side.
type pair struct {
	client, server net.Conn
	once           sync.Once
	dropped        bool // Blackhole dropped some of its bytes; guarded by Proxy.mu
}

// New starts a proxy on a free port of 127.0.0.1 that forwards to upstream
// ("host:port", host a loopback address).
func New(upstream string) (*Proxy, error) {
	host, _, err := net.SplitHostPort(upstream)
	if err != nil {
		return nil, fmt.Errorf("faultproxy: upstream %q: %w", upstream, err)
	}
	if ip := net.ParseIP(host); (ip == nil || !ip.IsLoopback()) && host != "localhost" {
		return nil, fmt.Errorf("faultproxy: upstream %q is not a loopback address", upstream)
	}
	p := &Proxy{
		upstream: upstream,
		conns:    make(map[*pair]struct{}),
		healed:   closedChan(),
		rnd:      rand.New(rand.NewSource(1)),
		done:     make(chan struct{}),
	}
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	p.addr = ln.Addr().String()
	p.serve(ln)
	return p, nil
}

func closedChan() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}

// Addr is the proxy's "127.0.0.1:port". It stays the same across Stop and
// Start.
func (p *Proxy) Addr() string { return p.addr }

// Host and Port split Addr, for a pgx config.
func (p *Proxy) Host() string { h, _, _ := net.SplitHostPort(p.addr); return h }

// Port is the port of Addr.
func (p *Proxy) Port() uint16 {
	_, port, _ := net.SplitHostPort(p.addr)
	var n uint16
	_, _ = fmt.Sscan(port, &n)
	return n
}

// SetLatency delays every chunk of bytes, in each direction, by base plus a
// uniform jitter in [-jitter, +jitter], drawn from a generator seeded with
// seed so that a run can be replayed.
func (p *Proxy) SetLatency(base, jitter time.Duration, seed int64) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.latency, p.jitter = base, jitter
	p.rnd = rand.New(rand.NewSource(seed))
}

// SetMode switches every connection, open or future, to m. Leaving Stall
// delivers the bytes it held. Leaving Blackhole resets the connections that
// lost bytes: their streams have a hole, as TCP connections have after a
// partition that outlasted their retransmissions.
func (p *Proxy) SetMode(m Mode) {
	p.mu.Lock()
	if m == p.mode {
		p.mu.Unlock()
		return
	}
	if m == Stall {
		p.healed = make(chan struct{})
	} else if p.mode == Stall {
		close(p.healed)
	}
	var broken []*pair
	if p.mode == Blackhole {
		for c := range p.conns {
			if c.dropped {
				broken = append(broken, c)
			}
		}
		p.stats.Resets += len(broken)
	}
	p.mode = m
	p.mu.Unlock()
	for _, c := range broken {
		c.reset()
	}
}

// ResetAll resets every open connection, on both sides, with an RST
// (SO_LINGER 0), and returns how many it reset. New connections are still
// accepted.
func (p *Proxy) ResetAll() int {
	p.mu.Lock()
	pairs := make([]*pair, 0, len(p.conns))
	for c := range p.conns {
		pairs = append(pairs, c)
	}
	p.stats.Resets += len(pairs)
	p.mu.Unlock()
	for _, c := range pairs {
		c.reset()
	}
	return len(pairs)
}

// Stop stops listening (new connections are refused) and resets every open
// connection, as when the host of the proxy dies. Start brings it back.
func (p *Proxy) Stop() {
	p.mu.Lock()
	ln := p.ln
	p.ln = nil
	p.mu.Unlock()
	if ln != nil {
		_ = ln.Close()
	}
	p.ResetAll()
}

// Start listens again on the same address after Stop.
func (p *Proxy) Start() error {
	p.mu.Lock()
	running, closed := p.ln != nil, p.closed
	p.mu.Unlock()
	if closed {
		return errors.New("faultproxy: closed")
	}
	if running {
		return nil
	}
	ln, err := (&net.ListenConfig{}).Listen(context.Background(), "tcp", p.addr)
	if err != nil {
		return fmt.Errorf("faultproxy: listening again on %s: %w", p.addr, err)
	}
	p.serve(ln)
	return nil
}

// Stats returns the counters so far.
func (p *Proxy) Stats() Stats {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.stats
}

// Close stops the proxy, resets every connection and waits for all its
// goroutines. It is idempotent.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	close(p.done)
	p.mu.Unlock()
	p.Stop()
	p.wg.Wait()
}

func (p *Proxy) serve(ln net.Listener) {
	p.mu.Lock()
	p.ln = ln
	p.mu.Unlock()
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return // listener closed by Stop or Close
			}
			p.accept(c)
		}
	}()
}

func (p *Proxy) accept(client net.Conn) {
	server, err := (&net.Dialer{Timeout: 5 * time.Second}).DialContext(context.Background(), "tcp", p.upstream)
	if err != nil {
		_ = client.Close()
		return
	}
	c := &pair{client: client, server: server}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		c.reset()
		return
	}
	p.conns[c] = struct{}{}
	p.stats.Accepted++
	p.mu.Unlock()
	p.wg.Add(2)
	go p.pump(c, client, server)
	go p.pump(c, server, client)
}

// pump copies one direction of one connection, applying the mode and the
// latency chunk by chunk. When either side ends, the whole pair is closed.
func (p *Proxy) pump(c *pair, from, to net.Conn) {
	defer p.wg.Done()
	defer func() {
		c.close()
		p.mu.Lock()
		delete(p.conns, c)
		p.mu.Unlock()
	}()
	buf := make([]byte, chunkSize)
	for {
		n, err := from.Read(buf)
		if n > 0 && !p.forward(c, buf[:n], to) {
			return
		}
		if err != nil {
			return
		}
	}
}

// forward applies the current mode and latency to one chunk and writes it.
// It reports false when the pair should be closed.
func (p *Proxy) forward(c *pair, chunk []byte, to net.Conn) bool {
	p.mu.Lock()
	mode, healed, delay := p.mode, p.healed, p.delayLocked()
	if mode == Blackhole {
		p.stats.DroppedBytes += int64(len(chunk))
		c.dropped = true
	}
	p.mu.Unlock()
	switch mode {
	case Blackhole:
		return true
	case Stall:
		select {
		case <-healed:
		case <-p.done:
			return false
		}
		p.mu.Lock()
		p.stats.LateBytes += int64(len(chunk))
		p.mu.Unlock()
	}
	if delay > 0 {
		t := time.NewTimer(delay)
		select {
		case <-t.C:
		case <-p.done:
			t.Stop()
			return false
		}
	}
	_, err := to.Write(chunk)
	return err == nil
}

func (p *Proxy) delayLocked() time.Duration {
	d := p.latency
	if p.jitter > 0 {
		d += time.Duration(p.rnd.Int63n(int64(2*p.jitter)+1)) - p.jitter
	}
	return max(d, 0)
}

func (c *pair) reset() {
	for _, conn := range []net.Conn{c.client, c.server} {
		if tcp, ok := conn.(*net.TCPConn); ok {
			_ = tcp.SetLinger(0)
		}
	}
	c.close()
}

func (c *pair) close() {
	c.once.Do(func() {
		_ = c.client.Close()
		_ = c.server.Close()
	})
}
