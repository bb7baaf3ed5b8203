// Package coalesce sends calls of one kind the way a database commits a
// group: a call that finds fewer than Limit statements in flight is sent at
// once, alone, so that an idle caller adds no delay and a few calls at once
// run in parallel; calls made while Limit statements are in flight wait for
// the first of them to return, and then go out together in one statement.
//
// What a Coalescer guarantees:
//
//   - A burst of B calls costs at most Limit + 1 statements at a time, not B.
//   - Each call gets its own result, the one Send returned at its index.
//   - A call whose caller stops waiting before it is sent is never sent; one
//     whose caller stops waiting after it was sent has its result handed to
//     Orphan once the statement returns, also when the result came as the
//     caller stopped: a caller whose context has ended gets its cause. With
//     no Orphan, a result that came is the caller's.
//   - A statement is cancelled only once every caller in it has stopped
//     waiting: one caller who gives up does not fail the others.
//   - Wait returns once no goroutine of the Coalescer is left, an Orphan's
//     included.
//
// It knows nothing of what it sends: which calls may share a statement is
// the caller's business (two claims of one key must not, and never reach a
// Coalescer together).
package coalesce

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// Coalescer batches calls of Q into statements that return one R per Q.
// Its exported fields are set before its first call and not changed after.
type Coalescer[Q, R any] struct {
	// Send sends one statement for qs and writes the result of each q at
	// its index in rs (as long as qs, of zero values). ctx ends only once
	// every caller in qs has stopped waiting. It keeps neither slice once
	// it returns.
	Send func(ctx context.Context, qs []Q, rs []R)
	// Limit is how many statements may be in flight at once.
	Limit int
	// Linger, if not zero, is how long a statement sent alone keeps its
	// place in flight: one that waits longer (a claim on a row lock held
	// by another transaction) gives its place up to the calls queued
	// meanwhile, so that one slow statement cannot hold up the others.
	Linger time.Duration
	// Orphan, if not nil, gets the result of a call whose caller stopped
	// waiting after it was sent.
	Orphan func(Q, R)

	mu      sync.Mutex
	flying  int  // statements in flight
	held    bool // calls queue until Release
	queue   []*call[Q, R]
	onQueue func()     // called with mu held whenever a call is queued
	running int        // goroutines of run and of orphan
	idle    *sync.Cond // signalled when running drops to 0; nil until Wait
	ones    sync.Pool  // *one[Q, R]: the buffers of calls sent alone (alone)
}

// one is what a call sent alone needs besides its statement: its q and r
// as slices of one for Send, and the flag and timer through which it gives
// its place in flight up after Linger. It is taken from Coalescer.ones for
// one call at a time, so no two calls ever share it, and put back only
// when its timer's function neither ran nor will run (Stop returned
// true): a function of an earlier call can then never give up the place
// of a later one. A call whose statement outlasted Linger drops it.
type one[Q, R any] struct {
	qs     [1]Q
	rs     [1]R
	given  atomic.Bool
	linger *time.Timer // made by the first call that uses it, then Reset
}

// call is one caller waiting for the next statement.
type call[Q, R any] struct {
	ctx  context.Context
	q    Q
	r    R
	sent bool // taken into a statement; guarded by Coalescer.mu
	gone bool // its caller stopped waiting; guarded by Coalescer.mu
	done chan struct{}
}

// Do sends q, alone or with the calls that arrive while another statement
// is in flight, and returns its result. If ctx ends first, Do returns its
// cause; handedOff then says whether q had been sent already, in which case
// Orphan gets its result once the statement returns.
func (c *Coalescer[Q, R]) Do(ctx context.Context, q Q) (r R, handedOff bool, err error) {
	c.mu.Lock()
	if !c.held && c.flying < c.Limit {
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
		if ctx.Err() == nil || c.Orphan == nil {
			return w.r, false, nil
		}
	case <-ctx.Done():
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	select {
	case <-w.done:
		if c.Orphan == nil {
			return w.r, false, nil // nobody else would have it
		}
		// The result came as the caller stopped waiting: it goes to Orphan
		// all the same, so that which of the two Do saw first decides
		// nothing.
		c.orphan(w)
		return r, true, context.Cause(ctx)
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

// alone sends q in a statement of its own, in one of the Limit places in
// flight, which it gives up after Linger (see Linger): whichever of the
// statement's return and the Linger timer comes first gives the place up,
// once. Its slices of one and its timer are reused (see one).
func (c *Coalescer[Q, R]) alone(ctx context.Context, q Q) R {
	o, _ := c.ones.Get().(*one[Q, R])
	if o == nil {
		o = &one[Q, R]{}
	}
	o.qs[0] = q
	if c.Linger > 0 {
		o.given.Store(false)
		if o.linger == nil {
			o.linger = time.AfterFunc(c.Linger, func() { c.giveUp(o) })
		} else {
			o.linger.Reset(c.Linger)
		}
	}
	c.Send(ctx, o.qs[:], o.rs[:])
	r := o.rs[0]
	reuse := c.Linger <= 0 || o.linger.Stop()
	c.giveUp(o)
	if reuse {
		o.qs, o.rs = [1]Q{}, [1]R{} // nothing of this call is kept alive
		c.ones.Put(o)
	}
	return r
}

// giveUp gives up the place in flight of the call sent alone with o, once
// of its statement's return and its Linger timer, whichever comes first.
func (c *Coalescer[Q, R]) giveUp(o *one[Q, R]) {
	if c.Linger <= 0 || o.given.CompareAndSwap(false, true) {
		c.next()
	}
}

// next ends a statement: the calls queued meanwhile take its place in
// flight, in one statement on a goroutine of its own that lasts as long as
// calls keep arriving.
func (c *Coalescer[Q, R]) next() {
	batch := c.take()
	if batch == nil {
		return
	}
	c.mu.Lock()
	c.running++
	c.mu.Unlock()
	go func() {
		c.run(batch)
		c.exit()
	}()
}

// orphan hands the result of w, whose caller stopped waiting as it came,
// to Orphan on a goroutine of its own, which Wait waits for. c.mu is held.
func (c *Coalescer[Q, R]) orphan(w *call[Q, R]) {
	c.running++
	go func() {
		c.Orphan(w.q, w.r)
		c.exit()
	}()
}

// exit ends a goroutine of the Coalescer.
func (c *Coalescer[Q, R]) exit() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.running--
	if c.running == 0 && c.idle != nil {
		c.idle.Broadcast()
	}
}

// Wait returns once no goroutine of the Coalescer is left: no statement,
// an Orphan's included, runs after it returns unless a new call starts one.
func (c *Coalescer[Q, R]) Wait() {
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
func (c *Coalescer[Q, R]) take() []*call[Q, R] {
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
func (c *Coalescer[Q, R]) run(batch []*call[Q, R]) {
	for batch != nil {
		ctx, cancel := untilAllGone(batch)
		qs, rs := make([]Q, len(batch)), make([]R, len(batch))
		for i, w := range batch {
			qs[i] = w.q
		}
		c.Send(ctx, qs, rs)
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
			if c.Orphan != nil {
				c.Orphan(w.q, w.r)
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

// Hold makes calls queue until Release, and calls onQueue (if not nil),
// with the Coalescer's lock held, each time one does: tests use it to send
// a burst in one statement. The caller makes sure no statement is in
// flight.
func (c *Coalescer[Q, R]) Hold(onQueue func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.held, c.onQueue = true, onQueue
}

// Release sends what queued during Hold, in one statement, and stops
// calling Hold's onQueue.
func (c *Coalescer[Q, R]) Release() {
	c.mu.Lock()
	c.held, c.onQueue = false, nil
	c.flying++
	c.mu.Unlock()
	c.next()
}
