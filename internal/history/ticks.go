package history

import (
	"fmt"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// The runs of a job of ticks (pglease's WithPeriod), checked per tick of
// each job beside the lease model: a run of a tick begins with a claim
// that got a lease for that tick (Input.Tick, the lease's Tick()), and
// completes when its release is acknowledged (Release OK, its lease still
// current). At most one run of a tick completes, and no run of it begins
// once one completed. A run that lapsed (its holder cut off, its lease
// expired without a release) may be followed by another run of the same
// tick with a greater fence (WithCatchUp); expiry is not modelled, so any
// claim of a tick not yet completed may get it, with a greater fence than
// the tick's runs before.
//
// Operations without a tick (a lease of no tick, or a claim whose tick
// its caller did not learn: held, or of unknown outcome) are not in this
// model. An unknown outcome forks as in the lease model. Had an unknown
// claim taken effect, it would only forbid what the other branch allows
// (its run's fence is unknown, and it ends the run before it); so would
// an unknown release (it completes the tick): Prune keeps every verdict
// of this model too. A crash that loses a release does not undo
// a completion here: the run had ended and its holder was told so, and a
// second run of its tick would run the job twice.

// TickState is what the model knows of one tick of one job.
type TickState struct {
	// Fence is the fence of the tick's current run, or when Inexact a
	// lower bound: a claim whose outcome is unknown took the tick with a
	// fence above it. 0: no run yet.
	Fence     int64
	Inexact   bool
	Completed bool // a run of the tick completed
}

func (s TickState) String() string {
	if s.Fence == 0 && !s.Inexact {
		return "no run"
	}
	f := fmt.Sprintf("run %d", s.Fence)
	if s.Inexact {
		f = fmt.Sprintf("run >%d", s.Fence)
	}
	if s.Completed {
		f += " (completed)"
	}
	return f
}

// TickModel is the sequential specification of the runs of one tick of one
// job, partitioned by job and tick.
func TickModel() porcupine.Model {
	nd := porcupine.NondeterministicModel{
		Partition: byTick,
		Init:      func() []any { return []any{TickState{}} },
		Step: func(state, input, output any) []any {
			return stepTick(state.(TickState), input.(Input), output.(Output))
		},
		DescribeOperation: func(input, output any) string {
			return describeTick(input.(Input), output.(Output))
		},
		DescribeState: func(state any) string { return state.(TickState).String() },
	}
	return nd.ToModel()
}

// StepTick is the tick model's step for one state, for tests: the states
// the operation can lead to, none if it cannot happen in s.
func StepTick(s TickState, in Input, out Output) []TickState {
	var next []TickState
	for _, n := range stepTick(s, in, out) {
		next = append(next, n.(TickState))
	}
	return next
}

func stepTick(s TickState, in Input, out Output) []any {
	one := func(ok bool, n TickState) []any {
		if !ok {
			return nil
		}
		return []any{n}
	}
	if out.Outcome == Unknown {
		return []any{s, tickEffect(s, in)}
	}
	switch in.Kind {
	case Claim:
		switch out.Outcome {
		case Got:
			// A run begins: never once a run of the tick completed, and
			// with a greater fence than any run of it before (a catch-up).
			return one(!s.Completed && out.Fence > s.Fence, TickState{Fence: out.Fence})
		case Held:
			return one(true, s)
		}
	case Release:
		switch out.Outcome {
		case OK:
			// The run completes: it is the tick's current run, and the
			// first of the tick to complete.
			n := s
			n.Completed = true
			return one(!s.Completed && !s.Inexact && s.Fence == in.Fence, n)
		case Lost:
			return one(true, s)
		}
	}
	return nil // an operation this model does not have
}

// tickEffect is the state after in took effect, its outcome unknown to
// its caller.
func tickEffect(s TickState, in Input) TickState {
	switch in.Kind {
	case Claim:
		if !s.Completed {
			return TickState{Fence: s.Fence, Inexact: true}
		}
	case Release:
		if !s.Completed && !s.Inexact && s.Fence == in.Fence {
			s.Completed = true
		}
	}
	return s
}

// tickOf names the partition of a run's operation: its job and tick.
type tickOf struct {
	key  string
	tick int64
}

// byTick partitions a history by job and tick, leaving out the operations
// of no tick.
func byTick(history []porcupine.Operation) [][]porcupine.Operation {
	return partition(history, func(in Input) (tickOf, bool) {
		return tickOf{in.Key, in.Tick.UnixNano()}, !in.Tick.IsZero() && (in.Kind == Claim || in.Kind == Release)
	})
}

func describeTick(in Input, out Output) string {
	at := in.Tick.UTC().Format("15:04:05.000")
	switch in.Kind {
	case Claim:
		ret := out.Outcome.String()
		if out.Outcome == Got {
			ret = fmt.Sprintf("got %d", out.Fence)
		}
		return fmt.Sprintf("claim(%s, tick %s) -> %s", in.Holder, at, ret)
	case Release:
		return fmt.Sprintf("release(%s@%d, tick %s) -> %s", in.Holder, in.Fence, at, out.Outcome)
	}
	return describe(in, out)
}

// CheckTicks checks the runs of every tick in the history with porcupine
// within timeout, and returns its verdict with what VisualizeTicks draws.
func CheckTicks(ops []porcupine.Operation, timeout time.Duration) (porcupine.CheckResult, porcupine.LinearizationInfo) {
	return porcupine.CheckOperationsVerbose(TickModel(), ops, timeout)
}

// VisualizeTicks writes porcupine's HTML view of a checked history of
// ticks to path.
func VisualizeTicks(info porcupine.LinearizationInfo, path string) error {
	return porcupine.VisualizePath(TickModel(), info, path)
}

// IllegalTicks names the ticks whose runs porcupine finds illegal, each
// checked alone ("key@tick").
func IllegalTicks(ops []porcupine.Operation, timeout time.Duration) []string {
	var illegal []string
	for _, part := range byTick(ops) {
		if res, _ := CheckTicks(part, timeout); res == porcupine.Illegal {
			in := part[0].Input.(Input)
			illegal = append(illegal, fmt.Sprintf("%s@%s", in.Key, in.Tick.UTC().Format(time.RFC3339Nano)))
		}
	}
	sort.Strings(illegal)
	return illegal
}

// TickFigures tallies the runs of ticks in a history.
type TickFigures struct {
	Runs        int // claims that got a lease for a tick
	Ticks       int // ticks with at least one run
	Completions int // releases of a run acknowledged
	CatchUps    int // runs of a tick that had had a run before
}

// CountTicks tallies the runs of ticks in ops.
func CountTicks(ops []porcupine.Operation) TickFigures {
	var f TickFigures
	for _, part := range byTick(ops) {
		runs := 0
		for _, op := range part {
			switch in, out := op.Input.(Input), op.Output.(Output); {
			case in.Kind == Claim && out.Outcome == Got:
				runs++
			case in.Kind == Release && out.Outcome == OK:
				f.Completions++
			}
		}
		f.Runs += runs
		if runs > 0 {
			f.Ticks++
			f.CatchUps += runs - 1
		}
	}
	return f
}

// Run is a run of a tick as the ledger of runs records it.
type Run struct {
	Key     string
	Tick    time.Time
	Fence   int64
	Outcome string
}

// CompletedOnce checks the ledger of runs: no tick of a job has two runs
// completed. It returns one line per tick completed more than once.
func CompletedOnce(runs []Run) []string {
	completed := map[tickOf][]int64{}
	for _, r := range runs {
		if r.Outcome == "completed" {
			at := tickOf{r.Key, r.Tick.UnixNano()}
			completed[at] = append(completed[at], r.Fence)
		}
	}
	var problems []string
	for at, fences := range completed {
		if len(fences) > 1 {
			sort.Slice(fences, func(i, j int) bool { return fences[i] < fences[j] })
			problems = append(problems, fmt.Sprintf("%s: tick %s completed by the runs of fences %v",
				at.key, time.Unix(0, at.tick).UTC().Format(time.RFC3339Nano), fences))
		}
	}
	sort.Strings(problems)
	return problems
}
