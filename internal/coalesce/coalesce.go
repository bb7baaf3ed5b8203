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
	"slices"
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
	onQueue func()         // called with mu held whenever a call is queued
	running int            // goroutines of run and of orphan
	idle    *sync.Cond     // signalled when running drops to 0; nil until Wait
	ones    sync.Pool      // *one[Q, R]: the buffers of calls sent alone (alone)
	calls   sync.Pool      // *call[Q, R]: calls no one refers to any more (see call)
	bursts  []*burst[Q, R] // bursts no goroutine runs, to be used again
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

// call is one caller waiting for the next statement. It is taken from
// Coalescer.calls, and put back by its Do only once nothing else can refer
// to it: its result received, or taken out of the queue unsent. A call
// handed off (to Orphan, or to run as gone) is left to the collector.
type call[Q, R any] struct {
	ctx   context.Context
	q     Q
	r     R
	sent  bool          // taken into a statement; guarded by Coalescer.mu
	gone  bool          // its caller stopped waiting; guarded by Coalescer.mu
	burst *burst[Q, R]  // the statement it was taken into; guarded by Coalescer.mu
	done  chan struct{} // of one: gets a value, with Coalescer.mu held, once r is set
}

// burst is one statement of queued calls, run by one goroutine at a time:
// its slices are used again by the next statement that goroutine sends,
// and the burst itself by the next goroutine once its own goroutine ends.
type burst[Q, R any] struct {
	calls []*call[Q, R]
	qs    []Q
	rs    []R
	// ctx is the statement's: it ends once left, the calls whose callers
	// still wait (guarded by Coalescer.mu), drops to 0, with the cause of
	// the last (see Do), so that a caller who gives up does not fail the
	// others; or once the statement has returned.
	ctx    context.Context
	cancel context.CancelCauseFunc
	left   int
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
	w, _ := c.calls.Get().(*call[Q, R])
	if w == nil {
		w = &call[Q, R]{done: make(chan struct{}, 1)}
	}
	w.ctx, w.q = ctx, q
	c.queue = append(c.queue, w)
	if c.onQueue != nil {
		c.onQueue()
	}
	c.mu.Unlock()

	answered := false
	select {
	case <-w.done:
		answered = true
		if ctx.Err() == nil || c.Orphan == nil {
			r = w.r
			c.free(w)
			return r, false, nil
		}
	case <-ctx.Done():
	}
	c.mu.Lock()
	if !answered {
		select {
		case <-w.done:
			answered = true
		default:
		}
	}
	switch {
	case answered && c.Orphan == nil:
		r = w.r // nobody else would have it
		c.mu.Unlock()
		c.free(w)
		return r, false, nil
	case answered:
		// The result came as the caller stopped waiting: it goes to Orphan
		// all the same, so that which of the two Do saw first decides
		// nothing.
		c.orphan(w)
		c.mu.Unlock()
		return r, true, context.Cause(ctx)
	case !w.sent:
		// Deleted with its slot cleared: the queue's array keeps nothing
		// of a call that is used again.
		c.queue = slices.DeleteFunc(c.queue, func(x *call[Q, R]) bool { return x == w })
		c.mu.Unlock()
		c.free(w)
		return r, false, context.Cause(ctx)
	}
	w.gone = true
	// The last caller of a statement to stop waiting ends it, with its
	// cause. cancel is the one of w's statement: the burst may carry the
	// next once c.mu is released.
	var cancel context.CancelCauseFunc
	if w.burst.left--; w.burst.left == 0 {
		cancel = w.burst.cancel
	}
	c.mu.Unlock()
	if cancel != nil {
		cancel(context.Cause(ctx))
	}
	return r, true, context.Cause(ctx)
}

// free puts w, which nothing refers to any more, back for another call.
func (c *Coalescer[Q, R]) free(w *call[Q, R]) {
	var zero call[Q, R]
	zero.done = w.done // empty: its one value, if any, was received
	*w = zero
	c.calls.Put(w)
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
	c.mu.Lock()
	b := c.take(nil)
	if b == nil {
		c.mu.Unlock()
		return
	}
	c.running++
	c.mu.Unlock()
	go func() {
		c.run(b)
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

// take, with c.mu held, marks every queued call sent and returns them in
// a burst (b, or a spare one if b is nil) to be sent in the place of a
// statement that has returned; with none queued (or held), that place is
// free, and b is kept for a later statement.
func (c *Coalescer[Q, R]) take(b *burst[Q, R]) *burst[Q, R] {
	if c.held || len(c.queue) == 0 {
		c.flying--
		if b != nil {
			c.bursts = append(c.bursts, b)
		}
		return nil
	}
	if b == nil {
		if n := len(c.bursts); n > 0 {
			b = c.bursts[n-1]
			c.bursts[n-1] = nil
			c.bursts = c.bursts[:n-1]
		} else {
			b = &burst[Q, R]{}
		}
	}
	b.calls, c.queue = c.queue, b.calls[:0]
	b.ctx, b.cancel = context.WithCancelCause(context.Background())
	b.left = len(b.calls)
	for _, w := range b.calls {
		w.sent, w.burst = true, b
	}
	return b
}

// run sends the calls of b, hands each caller its result, and goes on with
// the calls queued meanwhile.
func (c *Coalescer[Q, R]) run(b *burst[Q, R]) {
	for b != nil {
		n := len(b.calls)
		b.qs, b.rs = sized(b.qs, n), sized(b.rs, n)
		for i, w := range b.calls {
			b.qs[i] = w.q
		}
		c.Send(b.ctx, b.qs, b.rs)
		b.cancel(context.Canceled)
		var orphans []*call[Q, R]
		c.mu.Lock()
		for i, w := range b.calls {
			w.r = b.rs[i]
			if w.gone {
				orphans = append(orphans, w)
			}
			w.done <- struct{}{} // never blocks: its only value
		}
		c.mu.Unlock()
		for _, w := range orphans {
			if c.Orphan != nil {
				c.Orphan(w.q, w.r)
			}
		}
		// Nothing of these calls is kept alive; the rs are zero values
		// again for the next statement. The slices of a statement larger
		// than keptCalls are let go: one tick of thousands of claims
		// would otherwise hold their room for the Coalescer's life.
		clear(b.calls)
		clear(b.qs)
		clear(b.rs)
		b.calls, b.ctx, b.cancel = b.calls[:0], nil, nil
		if cap(b.calls) > keptCalls {
			b.calls, b.qs, b.rs = nil, nil, nil
		}
		c.mu.Lock()
		b = c.take(b)
		c.mu.Unlock()
	}
}

// keptCalls is the most calls a burst's slices keep room for once their
// statement has returned (the queue's array included, as the two swap).
const keptCalls = 256

// sized is s with length n, its elements the zero values: s itself when
// it has room (its elements cleared after each use), or a new one.
func sized[T any](s []T, n int) []T {
	if cap(s) < n {
		return make([]T, n)
	}
	return s[:n]
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
