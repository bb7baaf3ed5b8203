package pgtest

import (
	"bytes"
	"context"
	"fmt"
	"runtime/pprof"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// leakLabel is the profiler label that marks the goroutines of one
// NoGoroutineLeft call.
const leakLabel = "pgtest-leak-check"

// leakRuns numbers the calls of NoGoroutineLeft, so that each has a label
// of its own.
var leakRuns atomic.Int64

// leakGrace is how long a goroutine of f may take to end after f returned.
const leakGrace = 5 * time.Second

// NoGoroutineLeft runs f with every goroutine it starts, and every
// goroutine those start, under a profiler label of this call, and fails tb
// when one of them is still running leakGrace after f returned, with its
// stack. Unlike goleak's IgnoreCurrent, which counts every goroutine that
// started after it, it holds while other tests run in parallel: only f's
// goroutines carry its label. (A time.AfterFunc callback runs on a
// goroutine of its own, without the label: it is not counted.)
func NoGoroutineLeft(ctx context.Context, tb testing.TB, f func(ctx context.Context)) {
	tb.Helper()
	noGoroutineLeft(ctx, tb, leakGrace, f)
}

// noGoroutineLeft is NoGoroutineLeft with a grace of its own.
func noGoroutineLeft(ctx context.Context, tb testing.TB, grace time.Duration, f func(ctx context.Context)) {
	tb.Helper()
	id := fmt.Sprintf("run-%d", leakRuns.Add(1))
	pprof.Do(ctx, pprof.Labels(leakLabel, id), f)
	deadline := time.Now().Add(grace)
	for {
		left := goroutinesLabelled(id)
		if left == "" {
			return
		}
		if time.Now().After(deadline) {
			tb.Errorf("goroutines still running %v after the call that started them returned:\n%s", grace, left)
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// goroutinesLabelled returns the records of the goroutine profile whose
// goroutines carry the leak label id, "" when there are none.
func goroutinesLabelled(id string) string {
	var b bytes.Buffer
	if err := pprof.Lookup("goroutine").WriteTo(&b, 1); err != nil {
		return "reading the goroutine profile: " + err.Error()
	}
	mark := fmt.Sprintf("%q:%q", leakLabel, id)
	var found []string
	for _, record := range strings.Split(b.String(), "\n\n") {
		for _, line := range strings.Split(record, "\n") {
			if strings.HasPrefix(line, "# labels: ") && strings.Contains(line, mark) {
				found = append(found, record)
				break
			}
		}
	}
	return strings.Join(found, "\n\n")
}
