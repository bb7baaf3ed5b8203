package main

import (
	"bytes"
	"context"
	"io"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// demoOutput is what one run of the demo printed and returned.
type demoOutput struct {
	code           int
	stdout, stderr string
	terminal       string // stdout and stderr as one terminal shows them, in order
}

// terminal is one screen that stdout and stderr both write to.
type terminal struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (term *terminal) Write(p []byte) (int, error) {
	term.mu.Lock()
	defer term.mu.Unlock()
	return term.b.Write(p)
}

// runDemo runs the demo in-process and checks that it leaves no goroutine
// behind: schedulers shut down, Lockers and pools closed. The check counts
// only the demo's own goroutines, so that demos run in parallel.
func runDemo(ctx context.Context, t *testing.T, args ...string) demoOutput {
	t.Helper()
	var stdout, stderr bytes.Buffer
	var term terminal
	var code int
	pgtest.NoGoroutineLeft(ctx, t, func(ctx context.Context) {
		code = run(ctx, args, io.MultiWriter(&stdout, &term), io.MultiWriter(&stderr, &term))
	})
	out := demoOutput{code: code, stdout: stdout.String(), stderr: stderr.String(), terminal: term.b.String()}
	t.Logf("exit %d\n%s\nstderr:\n%s", out.code, out.stdout, out.stderr)
	return out
}

// count reads a number from the summary, by its label.
func (o demoOutput) count(t *testing.T, label string) int {
	t.Helper()
	m := regexp.MustCompile(`(?m)^  ` + regexp.QuoteMeta(label) + `\s+(\d+)`).FindStringSubmatch(o.stdout)
	require.NotNil(t, m, "summary line %q", label)
	n, err := strconv.Atoi(m[1])
	require.NoError(t, err)
	return n
}

// timelineRun is one run line of the timeline.
type timelineRun struct {
	tick    int64
	replica string
	fence   int64
}

var runLine = regexp.MustCompile(`(?m)^\s*-?\d+\.\d+s\s+(-?\d+)\s+(\S+)\s+(\d+)\s+\d+ms`)

func (o demoOutput) runs(t *testing.T) []timelineRun {
	t.Helper()
	var runs []timelineRun
	for _, m := range runLine.FindAllStringSubmatch(o.stdout, -1) {
		tick, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		fence, err := strconv.ParseInt(m[3], 10, 64)
		require.NoError(t, err)
		runs = append(runs, timelineRun{tick: tick, replica: m[2], fence: fence})
	}
	return runs
}

// ledgerLine is one run in the ledger the demo prints after its summary.
var ledgerLine = regexp.MustCompile(`(?m)^  \s*(-?\d+)  (replica-\d)\s+(\d+)  (\S+)`)

type printedRun struct {
	tick    int64
	replica string
	fence   int64
	outcome string
}

func (o demoOutput) ledger(t *testing.T) []printedRun {
	t.Helper()
	at := strings.Index(o.stdout, "\nledger of runs")
	require.Positive(t, at, "a ledger after the summary")
	var runs []printedRun
	for _, m := range ledgerLine.FindAllStringSubmatch(o.stdout[at:], -1) {
		tick, err := strconv.ParseInt(m[1], 10, 64)
		require.NoError(t, err)
		fence, err := strconv.ParseInt(m[3], 10, 64)
		require.NoError(t, err)
		runs = append(runs, printedRun{tick: tick, replica: m[2], fence: fence, outcome: m[4]})
	}
	return runs
}

// The demo as README's first command runs it, shorter: README's quick
// start (ticks with catch-up, no min hold), replicas started at random
// moments with clocks up to 300ms apart, and the replica running the job
// killed mid-run. The ledger it prints shows what README promises: the
// killed run lapsed, its tick run again once, on another replica, with a
// greater fence, and no tick completed twice. A period of 2s and a TTL of
// 3s put the lapse a period from the next claim either side of it, and
// leave the catch-up's wait (TTL + period) two seconds to spare.
func TestDemoRunsEachTickOnceAndCatchesUpTheKilledRunsTick(t *testing.T) {
	t.Parallel()
	const ttl, period = 3 * time.Second, 2 * time.Second
	out := runDemo(context.Background(), t, "-dsn", pgtest.Server.DSN(), "-table", "demo_ticks",
		"-duration", "16s", "-ttl", ttl.String(), "-period", period.String())

	require.Equal(t, 0, out.code)
	assert.Len(t, regexp.MustCompile(`(?m)^\s*\d+\.\d+s\s+replica-\d\s+STARTED`).FindAllString(out.stdout, -1), 3, "each replica's start is shown")
	assert.Contains(t, out.stdout, "ok: no tick completed twice")
	assert.Equal(t, 0, out.count(t, "double runs"))
	assert.Equal(t, 0, out.count(t, "missed otherwise"), "only the killed run's lease may skip ticks")
	// The killed run's lease lapses at most one TTL after the kill.
	assert.LessOrEqual(t, out.count(t, "skipped while failing over"), int(ttl/period)+1)
	assert.Equal(t, 1, out.count(t, "caught up"))
	assert.Equal(t, 1, out.count(t, "leases lost"), "the killed replica's lease, never released")

	killed := regexp.MustCompile(`(?m)^\s*\S+\s+(\d+)\s+(\S+)\s+(\d+)\s+\d+ms\s+KILLED mid-run`).FindStringSubmatch(out.stdout)
	require.NotNil(t, killed, "a KILLED line")
	killedTick, _ := strconv.ParseInt(killed[1], 10, 64)
	killedFence, _ := strconv.ParseInt(killed[3], 10, 64)
	assert.Regexp(t, `CAUGHT UP tick `+killed[1]+` from `+killed[2]+`: fence `+killed[3]+` -> \d+`, out.stdout, "the timeline shows the catch-up")

	// The ledger: the killed run lapsed, one other replica ran its tick
	// again with a greater fence, no tick completed twice, and the ticks
	// skipped were those while the killed run's lease held the key.
	all := out.ledger(t)
	require.NotEmpty(t, all)
	completed := map[int64]int{}
	var runs, lapsed, again, skipped []printedRun
	for _, r := range all {
		switch r.outcome {
		case "completed":
			completed[r.tick]++
			assert.Equal(t, 1, completed[r.tick], "tick %d completed twice: %v", r.tick, all)
		case "lapsed":
			lapsed = append(lapsed, r)
		case "skipped":
			skipped = append(skipped, r)
			assert.Greater(t, r.tick, killedTick, "a tick skipped after the killed run's: %v", r)
			continue // no run, and a fence of the skip's own
		default:
			t.Errorf("run %v: neither completed, lapsed nor skipped", r)
		}
		runs = append(runs, r)
		if r.tick == killedTick && r.fence != killedFence {
			again = append(again, r)
		}
	}
	require.Equal(t, []printedRun{{tick: killedTick, replica: killed[2], fence: killedFence, outcome: "lapsed"}}, lapsed,
		"the killed run, and only it, lapsed")
	require.Len(t, again, 1, "the killed run's tick caught up once")
	assert.LessOrEqual(t, len(skipped), int(ttl/period)+1, "skipped only while the killed run's lease held the key: %v", skipped)
	assert.NotEqual(t, killed[2], again[0].replica, "on another replica")
	assert.Greater(t, again[0].fence, killedFence, "with a greater fence")
	assert.Equal(t, "completed", again[0].outcome)
	assert.Regexp(t, `(?m)^\s+`+killed[1]+`\s+`+again[0].replica+`\s+\d+\s+completed\s+CAUGHT UP: lapsed on `+killed[2], out.stdout,
		"the ledger names the catch-up")

	// Every run the timeline shows is in the ledger, under its tick and
	// fence; fences grow from tick to tick, whoever runs it.
	inLedger := map[timelineRun]bool{}
	for _, r := range runs {
		inLedger[timelineRun{tick: r.tick, replica: r.replica, fence: r.fence}] = true
	}
	tlRuns := out.runs(t)
	require.NotEmpty(t, tlRuns)
	for _, r := range tlRuns {
		assert.True(t, inLedger[r], "timeline run %v in the ledger", r)
	}
	for i := 1; i < len(runs); i++ {
		assert.Greater(t, runs[i].fence, runs[i-1].fence, "fences grow: %v", runs[i])
	}

	// On a terminal, pglease's log comes after the timeline, the summary
	// and the ledger, never between the lines of their tables.
	verdict := strings.Index(out.terminal, "\nok: no tick completed twice")
	require.Positive(t, verdict)
	assert.NotContains(t, out.terminal[:verdict], "level=", "no log line inside the tables")
	assert.Contains(t, out.terminal[verdict:], "release_failed", "the log follows, with the release the killed replica could not make")
	assert.Regexp(t, `(?m)^\s*\d+\.\d+s\s+\d+\s+replica-\d\s+\d+\s+LEASE LOST`, out.stdout, "the loss's line names the replica in its column")
}

// The timing-only way (-ticks=false): replicas started at random moments,
// on the period's grid, with clocks up to 150ms apart (the min hold of
// 500ms leaves a timer 350ms to be late on a busy machine).
func TestDemoWithMinHoldRunsEachTickOnceAndFailsOverWithAGreaterFence(t *testing.T) {
	t.Parallel()
	const ttl, period = 2 * time.Second, time.Second
	out := runDemo(context.Background(), t, "-dsn", pgtest.Server.DSN(), "-table", "demo_min_hold", "-ticks=false",
		"-duration", "10s", "-ttl", ttl.String(), "-period", period.String(), "-skew", "150ms")

	require.Equal(t, 0, out.code)
	assert.Len(t, regexp.MustCompile(`(?m)^\s*\d+\.\d+s\s+replica-\d\s+STARTED`).FindAllString(out.stdout, -1), 3, "each replica's start is shown")
	assert.Contains(t, out.stdout, "ok: each tick ran exactly once")
	assert.Equal(t, 0, out.count(t, "double runs"), "min hold 500ms covers the 150ms clock skew")
	assert.Equal(t, 0, out.count(t, "missed otherwise"), "only the failover may miss ticks")
	// The killed replica's lease lapses at most one TTL after its last
	// renewal, which came before the kill; the tick after that is taken.
	assert.LessOrEqual(t, out.count(t, "skipped while failing over"), int(ttl/period)+1)
	assert.Equal(t, 1, out.count(t, "takeovers"))
	assert.Equal(t, 1, out.count(t, "leases lost"), "the killed replica's lease, never released")
	assert.Contains(t, out.stderr, "release_failed", "pglease logs the release the killed replica could not make")
	// On a terminal, pglease's log comes after the timeline and the
	// summary, never between the lines of their tables.
	summaryAt := strings.Index(out.terminal, "\nsummary:")
	require.Positive(t, summaryAt, "a summary")
	assert.NotContains(t, out.terminal[:summaryAt], "level=", "no log line inside the timeline")
	assert.NotContains(t, out.terminal[summaryAt:strings.Index(out.terminal, "ok: each tick")], "level=", "no log line inside the summary")
	assert.Contains(t, out.terminal[summaryAt:], "release_failed", "the log follows the summary")
	assert.Regexp(t, `(?m)^\s*\d+\.\d+s\s+\d+\s+replica-\d\s+\d+\s+LEASE LOST`, out.stdout, "the loss's line names the replica in its column")

	killed := regexp.MustCompile(`(?m)^.*\s(\S+)\s+(\d+)\s+\d+ms\s+KILLED mid-run`).FindStringSubmatch(out.stdout)
	require.NotNil(t, killed, "a KILLED line")
	takeover := regexp.MustCompile(`TAKEOVER from (\S+): fence (\d+) -> (\d+)`).FindStringSubmatch(out.stdout)
	require.NotNil(t, takeover, "a TAKEOVER line")
	assert.Equal(t, killed[1], takeover[1], "taken over from the killed replica")
	assert.Equal(t, killed[2], takeover[2], "the takeover names the killed run's fence")
	before, _ := strconv.ParseInt(takeover[2], 10, 64)
	after, _ := strconv.ParseInt(takeover[3], 10, 64)
	assert.Greater(t, after, before, "the new holder's fence is greater")

	// Fences only grow from tick to tick, whoever runs it.
	runs := out.runs(t)
	require.NotEmpty(t, runs)
	for i := 1; i < len(runs); i++ {
		assert.Greater(t, runs[i].tick, runs[i-1].tick, "one run per tick, in tick order: %v", runs[i])
		assert.Greater(t, runs[i].fence, runs[i-1].fence, "fences grow: %v", runs[i])
	}
}

// Without min hold, the replica that ran the tick releases the key as soon
// as its run ends, and a replica whose timer fires later claims the free
// key and runs the same tick again (gocron issue 841). The replicas' timers
// are spread evenly over the skew (150ms apart here) and a run takes at
// most a tenth of the period (50ms), so the key is free again well before
// the next replica's timer fires: the double runs come every tick, not by
// chance.
func TestDemoWithoutMinHoldRunsTicksTwice(t *testing.T) {
	t.Parallel()
	out := runDemo(context.Background(), t, "-dsn", pgtest.Server.DSN(), "-table", "demo_no_min_hold", "-ticks=false",
		"-min-hold", "0", "-duration", "4s", "-period", "500ms", "-ttl", "1s", "-skew", "300ms")

	assert.Equal(t, 0, out.code, "double runs are expected without min hold: not a failure")
	assert.Positive(t, out.count(t, "double runs"))
	assert.Contains(t, out.stdout, "DOUBLE RUN: tick")
}

// The quick start's former shape, -schedule immediately: each replica's
// ticks are in the phase of its start, which layout spreads over the
// period, and the min hold merges only the claims of one tick that arrive
// within it of each other. The job runs every two thirds of a period.
func TestDemoWithDurationJobsStartedImmediatelyRunsMoreOftenThanThePeriod(t *testing.T) {
	t.Parallel()
	out := runDemo(context.Background(), t, "-dsn", pgtest.Server.DSN(), "-table", "demo_immediately", "-ticks=false",
		"-schedule", "immediately", "-kill=false", "-duration", "8s", "-period", "1s")

	assert.Equal(t, 0, out.code, "extra runs are expected of this schedule: not a failure")
	assert.Contains(t, out.stdout, "NOT MET", "the header says which condition fails")
	assert.Positive(t, out.count(t, "double runs"))
	m := regexp.MustCompile(`one every (\S+) \(the median`).FindStringSubmatch(out.stdout)
	require.NotNil(t, m, "the median time between runs")
	gap, err := time.ParseDuration(m[1])
	require.NoError(t, err)
	assert.Less(t, gap, 850*time.Millisecond, "runs come about every two thirds of the 1s period")
}

// With -replica, each process runs one replica; two of them on the same
// table and -dsn agree on tick numbers without talking to each other, and
// share the ticks: each tick is run by exactly one of them.
func TestDemoReplicasInSeparateProcessesRunEachTickOnce(t *testing.T) {
	t.Parallel()
	names := []string{"east", "west"}
	outs := make([]demoOutput, len(names))
	pgtest.NoGoroutineLeft(context.Background(), t, func(ctx context.Context) {
		var wg sync.WaitGroup
		for i, name := range names {
			wg.Go(func() {
				var stdout, stderr bytes.Buffer
				code := run(ctx, []string{"-dsn", pgtest.Server.DSN(), "-table", "demo_processes",
					"-replica", name, "-duration", "4s", "-ttl", "2s"}, &stdout, &stderr)
				outs[i] = demoOutput{code: code, stdout: stdout.String(), stderr: stderr.String()}
			})
		}
		wg.Wait()
	})

	ranges := regexp.MustCompile(`ticks (\d+)\.\.(\d+) of the hour's grid`)
	first, last := int64(0), int64(1<<62)
	byTick := map[int64][]timelineRun{}
	for _, out := range outs {
		t.Logf("exit %d\n%s\nstderr:\n%s", out.code, out.stdout, out.stderr)
		require.Equal(t, 0, out.code)
		m := ranges.FindStringSubmatch(out.stdout)
		require.NotNil(t, m, "the tick range in the summary")
		lo, _ := strconv.ParseInt(m[1], 10, 64)
		hi, _ := strconv.ParseInt(m[2], 10, 64)
		first, last = max(first, lo), min(last, hi)
		for _, r := range out.runs(t) {
			byTick[r.tick] = append(byTick[r.tick], r)
		}
	}
	require.LessOrEqual(t, first, last, "both processes counted common ticks")
	for k := first; k <= last; k++ {
		assert.Len(t, byTick[k], 1, "tick %d runs exactly once across the processes: %v", k, byTick[k])
	}
	ticks := slices.Sorted(func(yield func(int64) bool) {
		for k := range byTick {
			if !yield(k) {
				return
			}
		}
	})
	for i := 1; i < len(ticks); i++ {
		assert.Greater(t, byTick[ticks[i]][0].fence, byTick[ticks[i-1]][0].fence, "fences grow across processes")
	}
}

// Ctrl-C (a cancelled context) stops the demo early and cleanly: schedulers
// shut down, Lockers closed, no goroutine left, the summary printed. It
// also takes the server from PGLEASE_DATABASE_URL when -dsn is not given.
func TestDemoStopsCleanlyWhenInterrupted(t *testing.T) {
	t.Setenv(pgserver.EnvDatabaseURL, pgtest.Server.DSN())
	ctx, cancel := context.WithTimeout(context.Background(), 2500*time.Millisecond)
	defer cancel()
	out := runDemo(ctx, t, "-table", "demo_interrupted", "-duration", "25s")

	require.Equal(t, 0, out.code)
	assert.Contains(t, out.stdout, "PostgreSQL from "+pgserver.EnvDatabaseURL)
	assert.Contains(t, out.stdout, "interrupted: stopping the replicas")
	ticks := out.count(t, "ticks")
	assert.Positive(t, ticks)
	assert.Less(t, ticks, 25, "stopped before the end of its duration")
	assert.Equal(t, 0, out.count(t, "double runs"))
}

// Whatever the seed, the replicas' claims (start plus clock lag) fall in
// phases spread over the period, no two more than half a period apart
// with three replicas: a schedule that is not aligned shows its extra
// runs, not a lucky bunch that a min hold would merge.
func TestLayoutSpreadsThePhasesOfTheReplicasClaimsOverThePeriod(t *testing.T) {
	t.Parallel()
	for seed := uint64(1); seed <= 200; seed++ {
		cfg := config{replicas: 3, period: time.Second, skew: 300 * time.Millisecond, startSpread: 3 * time.Second, seed: seed}
		_, lags, starts := layout(cfg)
		require.Equal(t, time.Duration(0), slices.Min(starts), "seed %d: the first replica starts at once", seed)
		require.Less(t, slices.Max(starts), cfg.startSpread, "seed %d: within the spread", seed)
		phases := make([]time.Duration, len(starts))
		for i := range starts {
			phases[i] = (starts[i] + lags[i]) % cfg.period
		}
		slices.Sort(phases)
		for i := range phases {
			gap := (phases[(i+1)%len(phases)] - phases[i] + cfg.period) % cfg.period
			require.Less(t, gap, cfg.period/2, "seed %d: phases %v", seed, phases)
		}
	}
}

func TestDemoRejectsBadFlags(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{
		{"-skew", "1s", "-period", "1s"},
		{"-schedule", "cron"},
		{"-schedule", "immediately"}, // a job of ticks is on the grid
		{"-start-spread", "30s"},
		{"-start-spread", "500ms", "-period", "1s"},
		{"-min-hold", "5s", "-ttl", "3s"},
		{"-replicas", "0"},
		{"-duration", "100ms"},
		{"extra"},
	} {
		var stdout, stderr bytes.Buffer
		assert.Equal(t, 2, run(context.Background(), args, &stdout, &stderr), "%v", args)
		assert.NotEmpty(t, stderr.String(), "%v says why", args)
	}
}
