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
//   - Running says whether a callback runs now: a Close called from a
//     callback must not Wait for the goroutine that runs it.
package serial

import "sync"

// Queue is a queue of callbacks. Its zero value is ready; Start starts
// its goroutine.
type Queue struct {
	mu      sync.Mutex
	calls   []func()
	sig     chan struct{} // a callback was queued, or Close
	done    chan struct{} // closed when the goroutine returns; nil until Start
	running bool          // a callback runs now
	closed  bool
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

// Running reports whether a callback runs now.
func (q *Queue) Running() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.running
}

// Wait waits until the goroutine has returned; at once if it never
// started.
func (q *Queue) Wait() {
	q.mu.Lock()
	done := q.done
	q.mu.Unlock()
	if done != nil {
		<-done
	}
}

func (q *Queue) run(done chan struct{}, sig <-chan struct{}) {
	defer close(done)
	for {
		q.mu.Lock()
		calls, closed := q.calls, q.closed
		q.calls = nil
		q.running = len(calls) > 0
		q.mu.Unlock()
		for _, f := range calls {
			f()
		}
		q.mu.Lock()
		q.running = false
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
