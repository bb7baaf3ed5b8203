package pglease

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// coalescer sends the statements of one kind (claims, releases) of a
// Locker the way a database commits a group: a call that finds fewer than
// limit statements in flight is sent at once, alone, so that an idle Locker
// adds no delay and a few calls at once run in parallel as before; calls
// made while limit statements are in flight wait for the first of them to
// return, and then go out together in one statement. A burst of B calls
// costs at most limit + 1 statements, not B.
//
// Each call is judged on its own in the statement (one row each), and each
// caller gets its own result. Two calls that must not share a statement
// (two claims of one key) never reach the coalescer together: keyTurns
// holds the second until the first is registered.
type coalescer[Q, R any] struct {
	// send sends one statement for qs and returns one result per q, in
	// order. ctx ends only once every caller in qs has stopped waiting.
	send func(ctx context.Context, qs []Q) []R
	// limit is how many statements may be in flight at once.
	limit int
	// linger, if not zero, is how long a statement sent alone keeps its
	// place in flight (see alone).
	linger time.Duration
	// orphan, if not nil, gets the result of a call whose caller stopped
	// waiting after it was sent.
	orphan func(Q, R)

	mu      sync.Mutex
	flying  int  // statements in flight
	held    bool // calls queue until release (tests)
	queue   []*call[Q, R]
	onQueue func()     // called with mu held whenever a call is queued (tests)
	running int        // goroutines of run
	idle    *sync.Cond // signalled when running drops to 0; nil until wait
}

// call is one caller waiting for the next statement.
type call[Q, R any] struct {
	ctx  context.Context
	q    Q
	r    R
	sent bool // taken into a statement; guarded by coalescer.mu
	gone bool // its caller stopped waiting; guarded by coalescer.mu
	done chan struct{}
}

// do sends q, alone or with the calls that arrive while another statement
// is in flight, and returns its result. If ctx ends first, do returns its
// cause; handedOff then says whether q had been sent already, in which case
// orphan gets its result once the statement returns.
func (c *coalescer[Q, R]) do(ctx context.Context, q Q) (r R, handedOff bool, err error) {
	c.mu.Lock()
	if !c.held && c.flying < c.limit {
		c.flying++
		c.mu.Unlock()
		return c.alone(ctx, q), false, nil
	}
	w := &call[Q, R]{ctx: ctx, q: q, done: make(chan struct{})}
	c.queue = append(c.queue, w)
	if c.onQueue != nil {
		c.onQueue()
	}
	c.mu.Unlock()

	select {
	case <-w.done:
		return w.r, false, nil
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-w.done:
		return w.r, false, nil
	default:
	}
	if !w.sent {
		for i, x := range c.queue {
			if x == w {
				c.queue = append(c.queue[:i], c.queue[i+1:]...)
				break
			}
		}
		return r, false, context.Cause(ctx)
	}
	w.gone = true
	return r, true, context.Cause(ctx)
}

// alone sends q in a statement of its own, in one of the limit places in
// flight. A statement that waits longer than linger (a claim on a row lock
// held by another transaction) gives its place up to the calls queued
// meanwhile, so that one locked row cannot hold up the Locker's other
// claims for as long as it is locked.
func (c *coalescer[Q, R]) alone(ctx context.Context, q Q) R {
	var (
		mu             sync.Mutex
		returned, gave bool
	)
	if c.linger > 0 {
		t := time.AfterFunc(c.linger, func() {
			mu.Lock()
			gave = !returned
			mu.Unlock()
			if gave {
				c.next()
			}
		})
		defer t.Stop()
	}
	r := c.send(ctx, []Q{q})[0]
	mu.Lock()
	returned = true
	gave2 := gave
	mu.Unlock()
	if !gave2 {
		c.next()
	}
	return r
}

// next ends a statement: the calls queued meanwhile take its place in
// flight, in one statement on a goroutine of its own that lasts as long as
// calls keep arriving.
func (c *coalescer[Q, R]) next() {
	batch := c.take()
	if batch == nil {
		return
	}
	c.mu.Lock()
	c.running++
	c.mu.Unlock()
	go func() {
		c.run(batch)
		c.mu.Lock()
		c.running--
		if c.running == 0 && c.idle != nil {
			c.idle.Broadcast()
		}
		c.mu.Unlock()
	}()
}

// wait returns once no goroutine of run is left: Close waits for it, so
// that no statement of the Locker, an orphan's give-back included, runs
// after Close returns.
func (c *coalescer[Q, R]) wait() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.idle == nil {
		c.idle = sync.NewCond(&c.mu)
	}
	for c.running > 0 {
		c.idle.Wait()
	}
}

// take marks every queued call sent and returns them to be sent in the
// place of a statement that has returned; with none queued (or held), that
// place is free.
func (c *coalescer[Q, R]) take() []*call[Q, R] {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.held || len(c.queue) == 0 {
		c.flying--
		return nil
	}
	batch := c.queue
	c.queue = nil
	for _, w := range batch {
		w.sent = true
	}
	return batch
}

// run sends batch, hands each caller its result, and goes on with the calls
// queued meanwhile.
func (c *coalescer[Q, R]) run(batch []*call[Q, R]) {
	for batch != nil {
		ctx, cancel := untilAllGone(batch)
		qs := make([]Q, len(batch))
		for i, w := range batch {
			qs[i] = w.q
		}
		rs := c.send(ctx, qs)
		cancel()
		var orphans []*call[Q, R]
		c.mu.Lock()
		for i, w := range batch {
			w.r = rs[i]
			if w.gone {
				orphans = append(orphans, w)
			}
			close(w.done)
		}
		c.mu.Unlock()
		for _, w := range orphans {
			if c.orphan != nil {
				c.orphan(w.q, w.r)
			}
		}
		batch = c.take()
	}
}

// untilAllGone is the context of a statement that carries the calls of
// batch: it ends once every one of their contexts has ended, with the cause
// of the last, so that a caller who gives up does not fail the others.
func untilAllGone[Q, R any](batch []*call[Q, R]) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancelCause(context.Background())
	var left atomic.Int64
	left.Store(int64(len(batch)))
	stops := make([]func() bool, len(batch))
	for i, w := range batch {
		stops[i] = context.AfterFunc(w.ctx, func() {
			if left.Add(-1) == 0 {
				cancel(context.Cause(w.ctx))
			}
		})
	}
	return ctx, func() {
		for _, stop := range stops {
			stop()
		}
		cancel(context.Canceled)
	}
}

// hold makes calls queue until release: tests use it to send a burst in
// one statement. The caller makes sure no statement is in flight.
func (c *coalescer[Q, R]) hold() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held = true
}

// release sends what queued during hold, in one statement.
func (c *coalescer[Q, R]) release() {
	c.mu.Lock()
	c.held = false
	c.flying++
	c.mu.Unlock()
	c.next()
}
