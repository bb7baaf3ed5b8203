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

var (
	tick1 = time.Date(2026, 12, 2, 13, 0, 0, 0, time.UTC)
	tick2 = tick1.Add(400 * time.Millisecond)
)

func claimTick(key, holder string, tick time.Time) Input {
	return Input{Key: key, Kind: Claim, Holder: holder, Tick: tick}
}

func releaseTick(key, holder string, fence int64, tick time.Time) Input {
	return Input{Key: key, Kind: Release, Holder: holder, Fence: fence, Tick: tick}
}

func checkTicks(t *testing.T, h *hist) porcupine.CheckResult {
	t.Helper()
	res, _ := CheckTicks(h.history(), 10*time.Second)
	return res
}

func TestATickRunOnceIsLegal(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(1, Input{Key: "j", Kind: Claim, Holder: "b"}, 5, is(Held), 12). // its tick unknown to its caller
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
		op(1, claimTick("j", "b", tick2), 40, got(2), 50).
		op(1, releaseTick("j", "b", 2, tick2), 60, is(OK), 70)
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
}

func TestACatchUpOfALapsedRunWithAGreaterFenceIsLegal(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(1, claimTick("j", "b", tick1), 40, got(3), 50). // a's run lapsed
		op(0, releaseTick("j", "a", 1, tick1), 60, is(Lost), 70).
		op(1, releaseTick("j", "b", 3, tick1), 80, is(OK), 90)
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
	// A run whose release was never acknowledged does not end the tick.
	h = (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(1, claimTick("j", "b", tick1), 40, got(3), 50).
		op(1, releaseTick("j", "b", 3, tick1), 80, is(OK), 90)
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
}

func TestACatchUpWhoseFenceIsNotAboveTheLapsedRunsIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(3), 10).
		op(1, claimTick("j", "b", tick1), 40, got(2), 50)
	assert.Equal(t, porcupine.Illegal, checkTicks(t, h))
}

func TestAClaimOfATickAlreadyCompletedIsAViolation(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
		op(1, claimTick("j", "b", tick1), 40, got(5), 50)
	assert.Equal(t, porcupine.Illegal, checkTicks(t, h))
	// The lease model alone accepts it: the tick is what forbids it.
	res, _ := Check(revoked, h.history(), 10*time.Second)
	assert.Equal(t, porcupine.Ok, res)
}

func TestTwoCompletedRunsOfATickAreAViolation(t *testing.T) {
	// Both runs began before either release: whatever the order, one of
	// them completes a tick that is no longer its run's, or after the
	// other completed.
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(1, claimTick("j", "b", tick1), 20, got(2), 30).
		op(0, releaseTick("j", "a", 1, tick1), 40, is(OK), 50).
		op(1, releaseTick("j", "b", 2, tick1), 45, is(OK), 55)
	assert.Equal(t, porcupine.Illegal, checkTicks(t, h))
	// A completion concurrent with the catch-up claim: either order is
	// illegal (a completed tick is never claimed; a released run that was
	// taken over was not current).
	h = (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 60).
		op(1, claimTick("j", "b", tick1), 30, got(2), 50).
		op(1, releaseTick("j", "b", 2, tick1), 70, is(OK), 80)
	assert.Equal(t, porcupine.Illegal, checkTicks(t, h))
}

func TestAnUnknownOutcomeOfATickRunMayHaveTakenEffectOrNot(t *testing.T) {
	// An unknown release: the catch-up after it is legal only in the
	// branch where it did not take effect, which porcupine may take.
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(Unknown), end).
		op(1, claimTick("j", "b", tick1), 40, got(2), 50).
		op(1, releaseTick("j", "b", 2, tick1), 60, is(OK), 70)
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
	// An unknown claim of the tick: the run before it may still complete
	// (it did not take effect, or took effect after the release).
	h = (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(1, claimTick("j", "b", tick1), 15, is(Unknown), end).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30)
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
	// But an unknown outcome does not make a claim after a completion
	// legal.
	h = (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
		op(2, claimTick("j", "c", tick1), 35, is(Unknown), end).
		op(1, claimTick("j", "b", tick1), 40, got(4), 50)
	assert.Equal(t, porcupine.Illegal, checkTicks(t, h))
}

func TestStepOfAnUnknownTickOperationForksTheState(t *testing.T) {
	s := TickState{Fence: 1}
	assert.Equal(t, []TickState{s, {Fence: 1, Inexact: true}}, StepTick(s, claimTick("j", "b", tick1), is(Unknown)))
	assert.Equal(t, []TickState{s, {Fence: 1, Completed: true}}, StepTick(s, releaseTick("j", "a", 1, tick1), is(Unknown)))
	// After an unknown claim took effect, no run before it completes, and
	// a later run has a greater fence.
	inexact := TickState{Fence: 1, Inexact: true}
	assert.Empty(t, StepTick(inexact, releaseTick("j", "a", 1, tick1), is(OK)))
	assert.Empty(t, StepTick(inexact, claimTick("j", "c", tick1), got(1)))
	assert.Equal(t, []TickState{{Fence: 2}}, StepTick(inexact, claimTick("j", "c", tick1), got(2)))
	// A completed tick: no run begins, none completes again.
	done := TickState{Fence: 2, Completed: true}
	assert.Empty(t, StepTick(done, claimTick("j", "c", tick1), got(3)))
	assert.Empty(t, StepTick(done, releaseTick("j", "b", 2, tick1), is(OK)))
	assert.Equal(t, []TickState{done}, StepTick(done, claimTick("j", "c", tick1), is(Held)))
}

func TestPruningUnknownOutcomesKeepsEveryVerdictOfTheTicks(t *testing.T) {
	histories := []*hist{
		(&hist{}).
			op(0, claimTick("j", "a", tick1), 0, got(1), 10).
			op(0, releaseTick("j", "a", 1, tick1), 20, is(Unknown), end).
			op(1, claimTick("j", "b", tick1), 40, got(2), 50).
			op(1, releaseTick("j", "b", 2, tick1), 60, is(OK), 70),
		(&hist{}).
			op(0, claimTick("j", "a", tick1), 0, got(1), 10).
			op(1, claimTick("j", "b", tick1), 15, is(Unknown), end).
			op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30),
		(&hist{}).
			op(0, claimTick("j", "a", tick1), 0, got(1), 10).
			op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
			op(2, claimTick("j", "c", tick1), 35, is(Unknown), end).
			op(1, claimTick("j", "b", tick1), 40, got(4), 50),
	}
	for i, h := range histories {
		full, _ := CheckTicks(h.history(), 10*time.Second)
		kept, dropped := Prune(h.history())
		pruned, _ := CheckTicks(kept, 10*time.Second)
		assert.Positive(t, dropped)
		assert.Equal(t, full, pruned, "history %d", i)
	}
}

func TestTicksAreCheckedApart(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
		op(1, claimTick("j", "b", tick2), 40, got(2), 50).
		op(1, releaseTick("j", "b", 2, tick2), 60, is(OK), 70).
		op(1, claimTick("i", "b", tick1), 40, got(3), 50).
		op(1, releaseTick("i", "b", 3, tick1), 60, is(OK), 70).
		op(2, claim("j", "c"), 80, got(9), 90) // a lease of no tick
	assert.Equal(t, porcupine.Ok, checkTicks(t, h))
	h.op(2, claimTick("i", "c", tick1), 100, got(10), 110)
	res, _ := CheckTicks(h.history(), 10*time.Second)
	assert.Equal(t, porcupine.Illegal, res)
	assert.Equal(t, []string{"i@2026-12-02T13:00:00Z"}, IllegalTicks(h.history(), 10*time.Second))
	assert.Equal(t, TickFigures{Runs: 4, Ticks: 3, Completions: 3, CatchUps: 1}, CountTicks(h.history()))
}

func TestAViolationOfATickIsDrawnToAnHTMLFile(t *testing.T) {
	h := (&hist{}).
		op(0, claimTick("j", "a", tick1), 0, got(1), 10).
		op(0, releaseTick("j", "a", 1, tick1), 20, is(OK), 30).
		op(1, claimTick("j", "b", tick1), 40, got(5), 50)
	res, info := CheckTicks(h.history(), 10*time.Second)
	require.Equal(t, porcupine.Illegal, res)
	path := filepath.Join(t.TempDir(), "ticks.html")
	require.NoError(t, VisualizeTicks(info, path))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(b), "claim(b, tick 13:00:00.000)", "the operation is described")
}

func TestTheLedgerOfRunsHasAtMostOneCompletedRunPerTick(t *testing.T) {
	runs := []Run{
		{Key: "j", Tick: tick1, Fence: 1, Outcome: "lapsed"},
		{Key: "j", Tick: tick1, Fence: 3, Outcome: "completed"},
		{Key: "j", Tick: tick2, Fence: 4, Outcome: "completed"},
		{Key: "i", Tick: tick1, Fence: 2, Outcome: "completed"},
	}
	assert.Empty(t, CompletedOnce(runs))
	runs = append(runs, Run{Key: "j", Tick: tick2, Fence: 6, Outcome: "completed"})
	assert.Equal(t, []string{"j: tick 2026-12-02T13:00:00.4Z completed by the runs of fences [4 6]"}, CompletedOnce(runs))
}
