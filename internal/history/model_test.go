package history

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const revoked = "pglease:revoked"

// hist builds a history by hand: times are plain ticks, end is "returns at
// the end of the history".
type hist struct{ ops []porcupine.Operation }

const end = -1

func (h *hist) op(client int, in Input, call int64, out Output, ret int64) *hist {
	h.ops = append(h.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	return h
}

func (h *hist) history() []porcupine.Operation {
	var last int64
	for _, op := range h.ops {
		last = max(last, op.Call, op.Return)
	}
	ops := append([]porcupine.Operation(nil), h.ops...)
	for i := range ops {
		if ops[i].Return == end {
			ops[i].Return = last + 1
		}
	}
	return ops
}

func claim(key, holder string) Input { return Input{Key: key, Kind: Claim, Holder: holder} }
func release(key, holder string, fence int64) Input {
	return Input{Key: key, Kind: Release, Holder: holder, Fence: fence}
}
func write(key, holder string, fence int64) Input {
	return Input{Key: key, Kind: Write, Holder: holder, Fence: fence}
}
func read(key string) Input  { return Input{Key: key, Kind: Read} }
func got(fence int64) Output { return Output{Outcome: Got, Fence: fence} }
func is(o Outcome) Output    { return Output{Outcome: o} }
func seen(holder string, fence int64, live bool) Output {
	return Output{Outcome: Seen, Holder: holder, Fence: fence, Live: live}
}

func check(t *testing.T, h *hist) porcupine.CheckResult {
	t.Helper()
	res, _ := Check(revoked, h.history(), 10*time.Second)
	return res
}

func TestClaimsOfAnyHolderWithGrowingFencesAreLinearizable(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "b"), 20, got(4), 30). // expiry is not modelled: b may take it at any time
		op(0, claim("k", "a"), 25, is(Held), 35).
		op(0, claim("k", "a"), 40, got(7), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestAClaimWhoseFenceIsNotAboveAnEarlierOneIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(5), 10).
		op(1, claim("k", "b"), 20, got(5), 30)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(5), 10).
		op(1, claim("k", "b"), 20, got(3), 30)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestConcurrentClaimsMayLinearizeInTheOrderOfTheirFences(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(5), 30).
		op(1, claim("k", "b"), 10, got(3), 20)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestACommittedWriteOfAnOlderLeaseAfterANewerClaimCompletedIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, write("k", "a", 1), 20, is(Committed), 30).
		op(1, claim("k", "b"), 40, got(2), 50).
		op(0, write("k", "a", 1), 60, is(Committed), 70)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestACommittedWriteConcurrentWithTheNewerClaimMayLinearizeBeforeIt(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "b"), 40, got(2), 50).
		op(0, write("k", "a", 1), 45, is(Committed), 70).
		op(0, write("k", "a", 1), 60, is(Refused), 80)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestACommitWhoseReplyWasLostMayLandLateButNotAfterTheNextLease(t *testing.T) {
	// The commit's reply was lost: it returns at the end of the history,
	// and may linearize anywhere after its call while a1 is current.
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, write("k", "a", 1), 20, is(Committed), end).
		op(1, claim("k", "b"), 40, got(2), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "b"), 15, got(2), 18).
		op(0, write("k", "a", 1), 20, is(Committed), end)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestACommittedWriteAfterItsLeasesReleaseIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, release("k", "a", 1), 20, is(OK), 30).
		op(0, write("k", "a", 1), 40, is(Committed), 50)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestAReleaseThatFindsItsRowAfterTheRowWasSeenExpiredIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, seen("a", 1, false), 30).
		op(0, release("k", "a", 1), 40, is(OK), 50)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, seen("a", 1, false), 30).
		op(0, release("k", "a", 1), 40, is(Lost), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestAnExpiredRowSeenLiveAgainIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, seen("a", 1, false), 30).
		op(2, read("k"), 40, seen("a", 1, true), 50)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestReadsMaySeeLeasesNobodyReportedButNeverAFenceGoingBack(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, seen("c", 6, true), 30). // a claim whose reply was lost
		op(1, claim("k", "b"), 40, got(9), 50).
		op(2, read("k"), 60, seen("b", 9, true), 70)
	assert.Equal(t, porcupine.Ok, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "b"), 20, got(9), 30).
		op(2, read("k"), 40, seen("a", 1, true), 50)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, seen("b", 1, true), 30) // holder changed, fence did not
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(2, read("k"), 20, is(NotFound), 30)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestARowReleasedBeforeACrashMayBeLiveAgainAfterIt(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, release("k", "a", 1), 20, is(OK), 30).
		op(2, read("k"), 40, seen("a", 1, false), 50).
		op(2, read("k"), 60, seen("a", 1, true), 70)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, release("k", "a", 1), 20, is(OK), 30).
		op(2, read("k"), 40, seen("a", 1, false), 50).
		op(9, Input{Key: "k", Kind: Crash}, 52, is(OK), 58).
		op(2, read("k"), 60, seen("a", 1, true), 70)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestACommitAfterAnOperatorRevokedTheLeaseIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(3, Input{Key: "k", Kind: Revoke}, 20, Output{Outcome: Seen, Holder: "a", Fence: 1, Live: true, Changed: true}, 30).
		op(2, read("k"), 40, seen(revoked, 1, true), 50).
		op(0, write("k", "a", 1), 60, is(Committed), 70)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(3, Input{Key: "k", Kind: ForceExpire}, 20, Output{Outcome: Seen, Holder: "a", Fence: 1, Live: true, Changed: true}, 30).
		op(0, release("k", "a", 1), 40, is(OK), 50)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestAnUnknownOutcomeMayHaveTakenEffectOrNot(t *testing.T) {
	// Either branch of an unknown release: the commit after it linearizes
	// only if it did not take effect (yet).
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(0, release("k", "a", 1), 20, is(Unknown), end).
		op(1, write("k", "a", 1), 40, is(Committed), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
	// An unknown claim of c, revealed by a read; the commit of a after
	// the read cannot linearize.
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "c"), 20, is(Unknown), end).
		op(2, read("k"), 40, seen("c", 3, true), 50).
		op(0, write("k", "a", 1), 60, is(Committed), 70)
	assert.Equal(t, porcupine.Illegal, check(t, h))
	// An unknown revoke, revealed by a read.
	h = (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(3, Input{Key: "k", Kind: Revoke}, 20, is(Unknown), end).
		op(2, read("k"), 40, seen(revoked, 1, true), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
}

func TestStepOfAnUnknownOutcomeForksTheState(t *testing.T) {
	s := State{Holder: "a", Fence: 1}
	next := Step(revoked, s, claim("k", "b"), is(Unknown))
	require.Len(t, next, 2)
	assert.Equal(t, s, next[0])
	assert.Equal(t, State{Holder: "b", Fence: 1, Inexact: true}, next[1])
	next = Step(revoked, s, release("k", "a", 1), is(Unknown))
	assert.Equal(t, []State{s, {Holder: "a", Fence: 1, Released: true}}, next)
	// The inexact state accepts a greater fence only, and no commit.
	inexact := State{Holder: "b", Fence: 1, Inexact: true}
	assert.Empty(t, Step(revoked, inexact, read("k"), seen("b", 1, true)))
	assert.NotEmpty(t, Step(revoked, inexact, read("k"), seen("b", 2, true)))
	assert.Empty(t, Step(revoked, inexact, write("k", "b", 1), is(Committed)))
}

func TestPruningUnknownOutcomesKeepsEveryVerdict(t *testing.T) {
	histories := []*hist{
		(&hist{}).
			op(0, claim("k", "a"), 0, got(1), 10).
			op(0, release("k", "a", 1), 20, is(Unknown), end).
			op(1, write("k", "a", 1), 40, is(Committed), 50),
		(&hist{}).
			op(0, claim("k", "a"), 0, got(1), 10).
			op(1, claim("k", "c"), 20, is(Unknown), end).
			op(2, read("k"), 40, seen("c", 3, true), 50).
			op(0, write("k", "a", 1), 60, is(Committed), 70),
		(&hist{}).
			op(0, claim("k", "a"), 0, got(1), 10).
			op(1, claim("k", "b"), 5, is(Unknown), end).
			op(3, Input{Key: "k", Kind: ForceExpire}, 12, is(Unknown), end).
			op(0, write("k", "a", 1), 20, is(Committed), 30).
			op(1, claim("k", "b"), 40, got(2), 50).
			op(0, write("k", "a", 1), 60, is(Committed), 70),
	}
	for i, h := range histories {
		full, _ := Check(revoked, h.history(), 10*time.Second)
		kept, dropped := Prune(h.history())
		pruned, _ := Check(revoked, kept, 10*time.Second)
		assert.Positive(t, dropped)
		assert.Equal(t, full, pruned, "history %d", i)
	}
}

func TestKeysAreCheckedApart(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("j", "b"), 20, got(2), 30).
		op(0, write("k", "a", 1), 40, is(Committed), 50)
	assert.Equal(t, porcupine.Ok, check(t, h))
	h.op(1, claim("k", "b"), 60, got(3), 70).op(0, write("k", "a", 1), 80, is(Committed), 90)
	assert.Equal(t, porcupine.Illegal, check(t, h))
}

func TestAViolationIsDrawnToAnHTMLFile(t *testing.T) {
	h := (&hist{}).
		op(0, claim("k", "a"), 0, got(1), 10).
		op(1, claim("k", "b"), 40, got(2), 50).
		op(0, write("k", "a", 1), 60, is(Committed), 70)
	res, info := Check(revoked, h.history(), 10*time.Second)
	require.Equal(t, porcupine.Illegal, res)
	path := filepath.Join(t.TempDir(), "k.html")
	require.NoError(t, Visualize(revoked, info, path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(b), "write(a@1)", "the operation is described")
}

func TestRecorderPutsOpenOperationsAtTheEndOfTheHistory(t *testing.T) {
	base := time.Now()
	r := NewRecorder(base)
	r.Add(0, claim("k", "a"), base, got(1), base.Add(time.Millisecond))
	r.AddOpen(0, write("k", "a", 1), base.Add(2*time.Millisecond), is(Committed))
	r.Add(1, claim("k", "b"), base.Add(3*time.Millisecond), got(2), base.Add(5*time.Millisecond))
	ops := r.Operations()
	require.Len(t, ops, 3)
	assert.Equal(t, int64(5*time.Millisecond)+1, ops[1].Return)
	assert.Equal(t, map[string]int{"claim got": 2, "write committed": 1}, Count(ops))
	res, _ := Check(revoked, ops, 10*time.Second)
	assert.Equal(t, porcupine.Ok, res)
}
