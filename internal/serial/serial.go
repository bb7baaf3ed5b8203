// Package serial runs callbacks one at a time, in the order they were
// queued, on a goroutine of its own: an Elector's leadership callbacks.
//
// What a Queue guarantees:
//
//   - Callbacks run in the order Push queued them, one at a time, never
//     under the lock of whoever queued them (Push may be called under a
//     lock that a callback takes).
//   - After Close, the callbacks queued before it still run, and then the
//     goroutine returns; Wait waits for that.
//   - Calling says whether its caller is one of the queue's callbacks: a
//     Close called from a callback must not Wait for the goroutine that
//     runs it, and a Close called from anywhere else must.
package serial

import (
	"bytes"
	"context"
	"runtime"
	"strconv"
	"sync"
)

// Queue is a queue of callbacks. Its zero value is ready; Start starts
// its goroutine.
type Queue struct {
	mu     sync.Mutex
	calls  []func()
	sig    chan struct{} // a callback was queued, or Close
	done   chan struct{} // closed when the goroutine returns; nil until Start
	g      uint64        // the goroutine's id, once it runs
	closed bool
}

func (q *Queue) signal() {
	if q.sig == nil {
		q.sig = make(chan struct{}, 1)
	}
	select {
	case q.sig <- struct{}{}:
	default:
	}
}

// Start starts the goroutine that runs the callbacks, once.
func (q *Queue) Start() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.done != nil {
		return
	}
	if q.sig == nil {
		q.sig = make(chan struct{}, 1)
	}
	q.done = make(chan struct{})
	go q.run(q.done, q.sig)
}

// Push queues f.
func (q *Queue) Push(f func()) {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.calls = append(q.calls, f)
	q.signal()
}

// Close lets the goroutine return once it has run the callbacks queued
// so far.
func (q *Queue) Close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.signal()
}

// Calling reports whether its caller runs on q's goroutine: whether it is
// one of q's callbacks, or called from one.
func (q *Queue) Calling() bool {
	q.mu.Lock()
	g := q.g
	q.mu.Unlock()
	return g != 0 && g == goroutineID()
}

// Wait waits until the goroutine has returned, at once if it never
// started, or until ctx ends: then it returns ctx's error.
func (q *Queue) Wait(ctx context.Context) error {
	q.mu.Lock()
	done := q.done
	q.mu.Unlock()
	if done == nil {
		return nil
	}
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (q *Queue) run(done chan struct{}, sig <-chan struct{}) {
	defer close(done)
	q.mu.Lock()
	q.g = goroutineID()
	q.mu.Unlock()
	for {
		q.mu.Lock()
		calls, closed := q.calls, q.closed
		q.calls = nil
		q.mu.Unlock()
		for _, f := range calls {
			f()
		}
		q.mu.Lock()
		more := len(q.calls) > 0
		q.mu.Unlock()
		switch {
		case more: // queued while these ran
		case closed:
			return // closed before these were taken: they were the last
		default:
			<-sig
		}
	}
}

// goroutineID is the id of the calling goroutine, read from the first line
// of its stack trace ("goroutine 42 [running]:"). Go gives a goroutine no
// other identity; only Calling asks, once per Close.
func goroutineID() uint64 {
	var buf [64]byte
	line := buf[:runtime.Stack(buf[:], false)]
	line = bytes.TrimPrefix(line, []byte("goroutine "))
	if i := bytes.IndexByte(line, ' '); i > 0 {
		line = line[:i]
	}
	id, err := strconv.ParseUint(string(line), 10, 64)
	if err != nil {
		panic("serial: cannot read the goroutine's id from its stack trace: " + err.Error())
	}
	return id
}
