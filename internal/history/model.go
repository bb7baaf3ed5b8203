// Package history records what the callers of a lease table saw (every
// call and return of a randomized workload) and checks it: with porcupine,
// against a sequential model of one key's mandate, and directly, against
// the properties that need the local clocks of the callers (trust windows,
// fences that grow, rows left behind).
//
// The model's state is the current mandate of one key: the holder and
// fence of its row, and what is known of that row's end (released by its
// own mandate, or seen expired). Expiry is time-based and not modelled: a
// claim by anyone may succeed at any time, provided its fence is greater
// than the current one. An operation whose outcome the caller did not
// learn (an error, a timeout) is Unknown: the model may take either branch,
// and the operation may take effect at any time after its call.
//
// Beside it, a model of the runs of each tick of a job (ticks.go): at most
// one run of a tick completes, and none begins after one completed.
package history

import (
	"fmt"
	"time"

	"github.com/anishathalye/porcupine"
)

// Kind is what an operation did.
type Kind uint8

// The operations of the model.
const (
	// Claim: a claim of the key by Holder. Outcomes Got (with the fence
	// handed out), Held or Unknown.
	Claim Kind = iota + 1
	// Release: the release of Holder's mandate Fence. Outcomes OK, Lost or
	// Unknown.
	Release
	// Write: a transaction of Holder's mandate Fence that wrote a ledger
	// row, called Guard and committed. Outcomes Committed, Refused or
	// Unknown.
	Write
	// Read: an observer read the key's row. Outcomes Seen (Holder, Fence,
	// Live) or NotFound.
	Read
	// Revoke: an operator revoked the key's live lease. Outcome Seen with
	// the row as it was read and Changed, NotFound, or Unknown.
	Revoke
	// ForceExpire: an operator expired the key's live lease at once. As
	// Revoke.
	ForceExpire
	// Crash: the server crashed and restarted. A release commits
	// asynchronously: one not yet flushed is lost, and its row is live
	// again. Outcome OK.
	Crash
)

func (k Kind) String() string {
	switch k {
	case Claim:
		return "claim"
	case Release:
		return "release"
	case Write:
		return "write"
	case Read:
		return "read"
	case Revoke:
		return "revoke"
	case ForceExpire:
		return "force-expire"
	case Crash:
		return "crash"
	}
	return fmt.Sprintf("kind(%d)", k)
}

// Outcome is what the caller of an operation learnt.
type Outcome uint8

// The outcomes.
const (
	// Unknown: the caller got an error that does not say whether the
	// operation took effect.
	Unknown Outcome = iota
	// Got: a claim handed out Output.Fence.
	Got
	// Held: a claim found another holder's live lease and wrote nothing.
	Held
	// OK: a release expired its mandate's row.
	OK
	// Lost: a release found its mandate gone and wrote nothing.
	Lost
	// Committed: a guarded transaction's row is in the ledger.
	Committed
	// Refused: a guarded transaction's row is not in the ledger.
	Refused
	// Seen: a read, revoke or force-expire found the row Output.Holder,
	// Output.Fence, Output.Live (and changed it, if Output.Changed).
	Seen
	// NotFound: the key has no row.
	NotFound
)

func (o Outcome) String() string {
	return [...]string{"unknown", "got", "held", "ok", "lost", "committed", "refused", "seen", "not found"}[o]
}

// Input is an operation as called.
type Input struct {
	Key    string
	Kind   Kind
	Holder string // the claimant, or the holder of the mandate released or written under
	Fence  int64  // the mandate released or written under
	// Tick is the tick of a job's schedule the claim got its lease for, or
	// the release released a lease of (Lease.Tick()); zero for a lease of
	// no tick, and for a claim whose lease, if any, its caller never saw.
	// The lease model ignores it; the tick model (TickModel) checks the
	// runs of each tick.
	Tick time.Time
}

// Output is what an operation returned.
type Output struct {
	Outcome Outcome
	Holder  string // Seen: the row's holder
	Fence   int64  // Got: the fence handed out; Seen: the row's fence
	Live    bool   // Seen: the row had not expired
	Changed bool   // Seen by Revoke or ForceExpire: the row was changed
}

// State is the mandate of one key as the model knows it.
type State struct {
	Holder string
	// Fence is the current mandate's fence, or when Inexact a lower bound:
	// a claim whose outcome is unknown took the key with a fence above it.
	Fence    int64
	Inexact  bool
	Released bool // the current mandate's own release expired its row
	Dead     bool // the current mandate's row was seen expired: nothing revives it
}

func (s State) String() string {
	if s.Fence == 0 && s.Holder == "" {
		return "no row"
	}
	f := fmt.Sprintf("%d", s.Fence)
	if s.Inexact {
		f = fmt.Sprintf(">%d", s.Fence)
	}
	end := ""
	switch {
	case s.Dead:
		end = " (expired)"
	case s.Released:
		end = " (released)"
	}
	return fmt.Sprintf("%s@%s%s", s.Holder, f, end)
}

// current is whether the mandate (holder, fence) is the row's, still live
// as far as the model knows: a guarded commit or a release of it may
// linearize now.
func (s State) current(holder string, fence int64) bool {
	return !s.Inexact && s.Holder == holder && s.Fence == fence && !s.Released && !s.Dead
}

// Model is the sequential specification of one key's mandate. revoked is
// the holder an operator's Revoke writes (sqlstmt.RevokedHolder, "pglease:revoked").
func Model(revoked string) porcupine.Model {
	nd := porcupine.NondeterministicModel{
		Partition: byKey,
		Init:      func() []any { return []any{State{}} },
		Step: func(state, input, output any) []any {
			return step(revoked, state.(State), input.(Input), output.(Output))
		},
		DescribeOperation: func(input, output any) string {
			return describe(input.(Input), output.(Output))
		},
		DescribeState: func(state any) string { return state.(State).String() },
	}
	return nd.ToModel()
}

// Step is the model's step for one state, for tests: the states the
// operation can lead to, none if it cannot happen in state.
func Step(revoked string, s State, in Input, out Output) []State {
	var next []State
	for _, n := range step(revoked, s, in, out) {
		next = append(next, n.(State))
	}
	return next
}

func step(revoked string, s State, in Input, out Output) []any {
	one := func(ok bool, n State) []any {
		if !ok {
			return nil
		}
		return []any{n}
	}
	if out.Outcome == Unknown {
		// Either branch: nothing happened (yet), or it took effect.
		return []any{s, effect(revoked, s, in)}
	}
	switch in.Kind {
	case Claim:
		switch out.Outcome {
		case Got:
			// Expiry is not modelled: anyone may take the key, with a
			// greater fence than any before.
			return one(out.Fence > s.Fence, State{Holder: in.Holder, Fence: out.Fence})
		case Held:
			return one(true, s)
		}
	case Release:
		switch out.Outcome {
		case OK:
			// Its row was still this mandate's and live.
			n := s
			n.Released = true
			return one(s.current(in.Holder, in.Fence), n)
		case Lost:
			return one(true, s) // taken, or lapsed: expiry is not modelled
		}
	case Write:
		switch out.Outcome {
		case Committed:
			// Guard locked the row while it was this mandate's and live.
			return one(s.current(in.Holder, in.Fence), s)
		case Refused:
			return one(true, s)
		}
	case Crash:
		// What the current mandate's release or expiry ended may be live
		// again, as its last durable state.
		n := s
		n.Released, n.Dead = false, false
		return one(out.Outcome == OK, n)
	case Read, Revoke, ForceExpire:
		n, ok := observe(revoked, s, out)
		if !ok {
			return nil
		}
		if out.Outcome == Seen && out.Changed {
			switch {
			case in.Kind == Revoke && out.Live && out.Holder != revoked:
				n.Holder = revoked
			case in.Kind == ForceExpire && out.Live:
				n.Dead = true
			default:
				return nil // a change it would not make
			}
		}
		return one(true, n)
	}
	return nil // an outcome this kind of operation does not have
}

// observe is what reading the row (out) says of the state s: whether it
// can be the row now, and the state it reveals.
func observe(revoked string, s State, out Output) (State, bool) {
	if out.Outcome == NotFound {
		// Nothing deletes a row in these histories (the purge horizon is
		// far away).
		return s, s.Fence == 0 && s.Holder == ""
	}
	if out.Outcome != Seen {
		return s, false
	}
	switch {
	case out.Fence < s.Fence || (s.Inexact && out.Fence == s.Fence):
		return s, false // the row's fence went back
	case out.Fence > s.Fence:
		// A mandate nobody reported (a claim whose reply was lost, a
		// waiting claim's attempt): every claim takes a greater fence.
		return State{Holder: out.Holder, Fence: out.Fence, Dead: !out.Live}, true
	}
	n := s
	switch out.Holder {
	case s.Holder:
	case revoked:
		n.Holder = revoked // a revoke whose outcome its caller did not learn
	default:
		return s, false // the holder changed without a new fence
	}
	if out.Live && s.Dead {
		return s, false // an expired row came back
	}
	if !out.Live {
		n.Dead = true
	}
	return n, true
}

// effect is the state after in took effect, its outcome unknown to its
// caller.
func effect(revoked string, s State, in Input) State {
	switch in.Kind {
	case Claim:
		return State{Holder: in.Holder, Fence: s.Fence, Inexact: true}
	case Release:
		if s.current(in.Holder, in.Fence) {
			s.Released = true
		}
	case Revoke:
		if !s.Dead && s.Holder != revoked {
			s.Holder = revoked
		}
	case ForceExpire:
		s.Dead = true
	case Crash:
		s.Released, s.Dead = false, false
	}
	return s // a write changes no mandate; a read changes nothing
}

// byKey partitions a history by key: keys are independent rows.
func byKey(history []porcupine.Operation) [][]porcupine.Operation {
	return partition(history, func(in Input) (string, bool) { return in.Key, true })
}

// partition groups the operations of history by the part of each that
// part names, in the order each part first appears, leaving out those it
// names none (false).
func partition[P comparable](history []porcupine.Operation, part func(Input) (P, bool)) [][]porcupine.Operation {
	index := map[P]int{}
	var parts [][]porcupine.Operation
	for _, op := range history {
		p, ok := part(op.Input.(Input))
		if !ok {
			continue
		}
		i, seen := index[p]
		if !seen {
			i = len(parts)
			index[p] = i
			parts = append(parts, nil)
		}
		parts[i] = append(parts[i], op)
	}
	return parts
}

func describe(in Input, out Output) string {
	var call string
	switch in.Kind {
	case Claim:
		call = fmt.Sprintf("claim(%s)", in.Holder)
	case Release, Write:
		call = fmt.Sprintf("%s(%s@%d)", in.Kind, in.Holder, in.Fence)
	default:
		call = in.Kind.String() + "()"
	}
	var ret string
	switch out.Outcome {
	case Got:
		ret = fmt.Sprintf("got %d", out.Fence)
	case Seen:
		live := "live"
		if !out.Live {
			live = "expired"
		}
		ret = fmt.Sprintf("%s@%d %s", out.Holder, out.Fence, live)
		if out.Changed {
			ret += ", changed"
		}
	default:
		ret = out.Outcome.String()
	}
	return call + " -> " + ret
}
