package history

import (
	"math"
	"sort"
	"sync"
	"time"

	"github.com/anishathalye/porcupine"
)

// open marks the return of an operation that may take effect at any time
// after its call: Operations moves it to the end of the history.
const open = math.MaxInt64

// Recorder collects the operations of a history from many goroutines.
// Times are the test process's own (time.Now, monotonic), never a server's.
type Recorder struct {
	base time.Time

	mu  sync.Mutex
	ops []porcupine.Operation
}

// NewRecorder returns an empty history whose times count from base.
func NewRecorder(base time.Time) *Recorder { return &Recorder{base: base} }

func (r *Recorder) at(t time.Time) int64 { return int64(t.Sub(r.base)) }

// Add records an operation of client called at call that returned out at
// ret.
func (r *Recorder) Add(client int, in Input, call time.Time, out Output, ret time.Time) {
	r.add(client, in, r.at(call), out, r.at(ret))
}

// AddOpen records an operation of client called at call that may take
// effect at any time after it, even after its caller saw it end (a commit
// whose reply was lost, a statement delivered late): its return is the end
// of the history.
func (r *Recorder) AddOpen(client int, in Input, call time.Time, out Output) {
	r.add(client, in, r.at(call), out, open)
}

func (r *Recorder) add(client int, in Input, call int64, out Output, ret int64) {
	if ret < call {
		ret = call
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
}

// Operations returns the history so far, the open operations returning
// after every other event.
func (r *Recorder) Operations() []porcupine.Operation {
	r.mu.Lock()
	ops := append([]porcupine.Operation(nil), r.ops...)
	r.mu.Unlock()
	var end int64
	for _, op := range ops {
		end = max(end, op.Call)
		if op.Return != open {
			end = max(end, op.Return)
		}
	}
	for i := range ops {
		if ops[i].Return == open {
			ops[i].Return = end + 1
		}
	}
	sort.SliceStable(ops, func(i, j int) bool { return ops[i].Call < ops[j].Call })
	return ops
}

// Count tallies a history by kind and outcome ("claim got", "write
// committed", ...).
func Count(ops []porcupine.Operation) map[string]int {
	n := map[string]int{}
	for _, op := range ops {
		n[op.Input.(Input).Kind.String()+" "+op.Output.(Output).Outcome.String()]++
	}
	return n
}

// Prune drops the operations whose outcome is unknown and whose effect
// could only make the rest of the history harder to linearize, which is
// every unknown operation of this model but a crash: an unknown claim's fence is
// unknown, so nothing later can depend on it (a greater fence read later
// is accepted anyway), and its effect only forbids what the mandate before
// it allowed; an unknown release, revoke or force-expire only ends the
// current mandate sooner. The branch in which such an operation did not
// take effect (its return at the end of the history) therefore accepts
// every history the other branch accepts. Dropping them keeps porcupine's
// search from forking at each of them for nothing: its cost grows with
// the operations that stay pending together.
func Prune(ops []porcupine.Operation) (kept []porcupine.Operation, dropped int) {
	for _, op := range ops {
		if op.Output.(Output).Outcome == Unknown && op.Input.(Input).Kind != Crash {
			dropped++
			continue
		}
		kept = append(kept, op)
	}
	return kept, dropped
}

// Check checks the history with porcupine within timeout, and returns
// porcupine's verdict with what VisualizePath draws.
func Check(revoked string, ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(Model(revoked), ops, timeout)
}

// Visualize writes porcupine's HTML view of a checked history to path.
func Visualize(revoked string, info porcupine.LinearizationInfo, path string) error {
	return porcupine.VisualizePath(Model(revoked), info, path)
}
