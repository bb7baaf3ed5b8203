// Command replicas shows pglease keeping a gocron job to one run per tick
// across several replicas started at any moment, and what happens when the
// replica running it dies.
//
// With no configuration it starts a throwaway PostgreSQL (or uses
// PGLEASE_DATABASE_URL), runs three replicas of a gocron scheduler in one
// process, each with its own pool and its own pglease.Locker, all running
// the same job every second as README's quick start does: a job of ticks
// (pglease.WithPeriod, no min hold) with catch-up (pglease.WithCatchUp),
// scheduled by its JobLocker's Schedule. The replicas start at random
// moments, and their clocks disagree by up to 300ms (simulated: a
// replica's claims reach the database as late as its clock is slow).
// Midway it kills the replica that is running the job, mid-run and without
// releasing its lease, as a crash would: the ticks that come while the
// killed run's lease lives are skipped, and once it lapses another replica
// runs the killed run's tick again, with a greater fence. It prints a
// timeline, a summary, and the ledger of the job's runs (pglease.Admin.Runs:
// the killed run lapsed, its tick caught up on another replica), and exits
// 1 if a tick completed twice, was missed other than while the killed run
// held the key, or the killed run's tick was not caught up exactly once.
//
//	go run ./examples/replicas
//	go run ./examples/replicas -duration 12s                 # a short run
//	go run ./examples/replicas -ticks=false                  # the timing-only way: StartOnGrid and a min hold
//	go run ./examples/replicas -ticks=false -min-hold 0      # gocron issue 841: double runs
//	go run ./examples/replicas -ticks=false -schedule immediately   # the first quick start: runs too often
//	go run ./examples/replicas -dsn postgres://... -replica a   # one replica per terminal
package main

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/signal"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is the whole program: it parses args, runs the demo until its
// duration has passed or ctx ends, prints the summary, and returns the exit
// code: 0, 1 when a tick did not run exactly once although the conditions
// for it held (or the demo could not run), 2 for bad flags.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	cfg, err := parseFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintln(stderr, "replicas:", err)
		return 2
	}
	sum, err := demo(ctx, cfg, stdout, stderr)
	if err != nil {
		fmt.Fprintln(stderr, "replicas:", err)
		return 1
	}
	if sum.failed() {
		return 1
	}
	return 0
}

// config is what the flags set.
type config struct {
	dsn         string
	replicas    int
	replica     string // non-empty: run only this replica, for one terminal each
	duration    time.Duration
	period      time.Duration
	ttl         time.Duration
	minHold     time.Duration
	skew        time.Duration // how far apart the replicas' clocks are, at most
	startSpread time.Duration // the replicas start within this long
	schedule    string
	ticks       bool // the job claims ticks, with catch-up (README's quick start)
	kill        bool // kill the replica running the job midway
	seed        uint64
	table       string
}

// The schedules of -schedule.
const (
	// onGrid is README's quick start: a DurationJob on the period's grid
	// (pglease.StartOnGrid), the same ticks on every replica.
	onGrid = "grid"
	// immediately is the quick start's former shape: a DurationJob started
	// when its replica starts (gocron.WithStartImmediately), so that each
	// replica's ticks are in the phase of its own start.
	immediately = "immediately"
)

// defaultMinHold is half the period, at most the TTL: long enough to cover
// the skew between the replicas' clocks, short enough to free the key well
// before the next tick.
func defaultMinHold(period, ttl time.Duration) time.Duration {
	return min(period/2, ttl)
}

func parseFlags(args []string, stderr io.Writer) (config, error) {
	fs := flag.NewFlagSet("replicas", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cfg config
	minHoldSet := false
	fs.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL to use (default: PGLEASE_DATABASE_URL, or a throwaway server started for the demo)")
	fs.IntVar(&cfg.replicas, "replicas", 3, "replicas to run in this process")
	fs.StringVar(&cfg.replica, "replica", "", "run only the replica `NAME` (no kill), until Ctrl-C or -duration; start one per terminal with the same -dsn")
	fs.DurationVar(&cfg.duration, "duration", 25*time.Second, "how long the demo runs (with -replica, 0 runs until Ctrl-C)")
	fs.DurationVar(&cfg.period, "period", time.Second, "period of the job")
	fs.DurationVar(&cfg.ttl, "ttl", 2500*time.Millisecond, "lease TTL: how long the others wait after a replica dies (heartbeat every TTL/3); best not a multiple of the period, so that the lapse falls between two ticks")
	fs.BoolVar(&cfg.ticks, "ticks", true, "the job claims ticks with catch-up (pglease.WithPeriod, WithCatchUp, as README's quick start); false: the timing-only way (StartOnGrid and a min hold), for comparison")
	fs.Func("min-hold", "keep a released lease held until `duration` after its claim; 0 turns it off (default: off with -ticks, otherwise half the period, at most the TTL)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		cfg.minHold, minHoldSet = d, true
		return nil
	})
	fs.DurationVar(&cfg.skew, "skew", 300*time.Millisecond, "the replicas' clocks are up to this far apart (simulated: a replica's claims reach the database as late as its clock is slow)")
	fs.DurationVar(&cfg.startSpread, "start-spread", 3*time.Second, "the replicas start at random moments within this long of the first, at least one period (0: all at once)")
	fs.StringVar(&cfg.schedule, "schedule", onGrid, "with -ticks=false, the job's schedule: "+onGrid+" (pglease.StartOnGrid) or "+immediately+" (gocron.WithStartImmediately: each replica's ticks in the phase of its start)")
	fs.BoolVar(&cfg.kill, "kill", true, "kill the replica running the job at two fifths of the duration, without releasing (not with -replica)")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed for the replicas' start moments, their clocks and the job's durations")
	fs.StringVar(&cfg.table, "table", "pglease_demo", "lease table (created if missing)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if !minHoldSet && !cfg.ticks {
		cfg.minHold = defaultMinHold(cfg.period, cfg.ttl)
	}
	switch {
	case cfg.period <= 0:
		return cfg, fmt.Errorf("-period %v: must be positive", cfg.period)
	case cfg.ttl <= 0:
		return cfg, fmt.Errorf("-ttl %v: must be positive", cfg.ttl)
	case cfg.minHold < 0 || cfg.minHold > cfg.ttl:
		return cfg, fmt.Errorf("-min-hold %v: must be between 0 and the TTL (%v)", cfg.minHold, cfg.ttl)
	case cfg.skew < 0 || cfg.skew >= cfg.period:
		// Runs of one tick must start before the next tick, or the tick
		// numbering would mix them up.
		return cfg, fmt.Errorf("-skew %v: must be at least 0 and below the period (%v)", cfg.skew, cfg.period)
	case cfg.schedule != onGrid && cfg.schedule != immediately:
		return cfg, fmt.Errorf("-schedule %q: must be %q or %q", cfg.schedule, onGrid, immediately)
	case cfg.ticks && cfg.schedule != onGrid:
		return cfg, fmt.Errorf("-schedule %q: a job of ticks is on the period's grid: only with -ticks=false", cfg.schedule)
	case cfg.replica == "" && cfg.replicas < 1:
		return cfg, fmt.Errorf("-replicas %d: must be at least 1", cfg.replicas)
	case cfg.replica == "" && cfg.duration < cfg.period:
		return cfg, fmt.Errorf("-duration %v: must be at least one period (%v)", cfg.duration, cfg.period)
	case cfg.duration < 0:
		return cfg, fmt.Errorf("-duration %v: must not be negative", cfg.duration)
	case cfg.replica == "" && cfg.startSpread != 0 && (cfg.startSpread < cfg.period || cfg.startSpread >= cfg.duration):
		// A period at least, for the starts to spread over its phases.
		return cfg, fmt.Errorf("-start-spread %v: must be 0 (all at once), or at least the period (%v) and below the duration (%v)", cfg.startSpread, cfg.period, cfg.duration)
	}
	return cfg, nil
}

// lead is how long after the first replica's start its first tick may
// come at the earliest and still be counted as tick 0: the time it takes to
// schedule its job.
const lead = 50 * time.Millisecond

// demo runs the replicas until cfg.duration has passed or ctx ends, stops
// them, and prints the summary.
func demo(ctx context.Context, cfg config, stdout, stderr io.Writer) (summary, error) {
	// Replicas, hooks and the logger write from many goroutines.
	stdout, stderr = &syncWriter{w: stdout}, &syncWriter{w: stderr}
	dsn, where, closeServer, err := database(ctx, cfg.dsn)
	if err != nil {
		return summary{}, err
	}
	defer func() {
		if err := closeServer(); err != nil {
			fmt.Fprintln(stderr, "replicas: closing the PostgreSQL server:", err)
		}
	}()
	if err := migrate(ctx, dsn, cfg.table); err != nil {
		return summary{}, err
	}

	names, lags, starts := layout(cfg)
	lastLag := slices.Max(lags)
	tl := newTimeline(stdout, cfg.period, cfg.ttl, names)
	var kill *killSwitch
	if cfg.kill && cfg.replica == "" && len(names) > 1 {
		kill = &killSwitch{}
	}
	// pglease's own log, at warn level: a lost lease or a failed claim
	// shows, contention between replicas does not. No time: the timeline
	// has it. It is kept, with the errors of stopping a replica, and
	// written to stderr once the timeline and the summary are out, so that
	// no line of it lands in the middle of their tables on a terminal.
	var kept bytes.Buffer
	later := &syncWriter{w: &kept}
	defer func() {
		if kept.Len() > 0 {
			fmt.Fprintf(stderr, "\npglease's log (warn and above):\n%s", kept.String())
		}
	}()
	logger := slog.New(slog.NewTextHandler(later, &slog.HandlerOptions{
		Level: slog.LevelWarn,
		ReplaceAttr: func(groups []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey && len(groups) == 0 {
				return slog.Attr{}
			}
			return a
		},
	}))

	reps := make([]*replica, 0, len(names))
	stopped := false
	stopAll := func() {
		if stopped {
			return
		}
		stopped = true
		kill.disarmAndWait()
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		for _, r := range reps {
			if err := r.stop(ctx); err != nil {
				fmt.Fprintf(later, "replicas: stopping %s: %v\n", r.name, err)
			}
		}
	}
	defer stopAll() // on the error paths; a no-op after the regular stop
	for i, name := range names {
		r, err := newReplica(ctx, cfg, name, lags[i], starts[i], dsn, tl, kill, logger, cfg.seed)
		if err != nil {
			return summary{}, fmt.Errorf("%s: %w", name, err)
		}
		reps = append(reps, r)
	}

	origin := time.Now() // the first replica starts now, the others later
	t0, firstTick := base(cfg, origin)
	tl.setBase(origin, t0)
	if kill != nil {
		kill.at = tl.tickAt(firstTick).Add(cfg.duration * 2 / 5)
	}
	printHeader(stdout, cfg, where, reps, kill != nil)
	tl.header()

	// A tick is complete once the latest clock's claim has been sent for
	// it, plus half the quiet time before the next tick (settle) for its
	// run to end: the demo stops then, and counts only complete ticks.
	settle := (cfg.period - lastLag) / 2
	completeBy := func(at time.Time) int64 {
		last := floorDiv(at.Sub(t0.Add(lastLag+settle)), cfg.period)
		return max(0, last-firstTick+1)
	}
	var deadline <-chan time.Time
	if cfg.duration > 0 {
		ticks := int64(cfg.duration / cfg.period)
		stopAt := t0.Add(time.Duration(firstTick+ticks-1)*cfg.period + lastLag + settle)
		timer := time.NewTimer(time.Until(stopAt))
		defer timer.Stop()
		deadline = timer.C
	}
	// Start each replica at its moment, in the order of their moments, as
	// processes deployed one after the other would.
	pending := slices.SortedStableFunc(slices.Values(reps), func(a, b *replica) int { return cmp.Compare(a.startAt, b.startAt) })
wait:
	for {
		var due <-chan time.Time
		if len(pending) > 0 {
			due = time.After(time.Until(origin.Add(pending[0].startAt)))
		}
		select {
		case <-due:
			r := pending[0]
			pending = pending[1:]
			if err := r.start(cfg.period, cfg.schedule); err != nil {
				return summary{}, fmt.Errorf("%s: %w", r.name, err)
			}
		case <-deadline:
			break wait
		case <-ctx.Done():
			fmt.Fprintln(stdout, "interrupted: stopping the replicas")
			break wait
		}
	}
	stoppedAt := time.Now()
	ticks := completeBy(stoppedAt)
	stopAll()

	// A lone -replica sees its own runs only: the other processes run the
	// other ticks, and it cannot check them.
	sum := tl.summarize(firstTick, ticks, promise(cfg).holds && cfg.replica == "", cfg.ticks, stoppedAt)
	if cfg.ticks {
		// The ledger, once every replica has stopped and released: this
		// process's runs, or with -replica every process's since this one
		// started.
		var holders map[string]bool
		if cfg.replica == "" {
			holders = make(map[string]bool, len(reps))
			for _, r := range reps {
				holders[r.locker.Holder()] = true
			}
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		sum.ledger = readLedger(lctx, dsn, cfg.table, time.Since(origin)+cfg.period, holders, tl)
		cancel()
	}
	sum.print(stdout, cfg, reps)
	return sum, nil
}

// database returns the server to use: -dsn as given, otherwise
// PGLEASE_DATABASE_URL or a throwaway server started for the demo
// (internal/pgserver), and how to close it.
func database(ctx context.Context, dsn string) (string, string, func() error, error) {
	if dsn != "" {
		return dsn, "PostgreSQL at " + pgserver.Redact(dsn), func() error { return nil }, nil
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return "", "", nil, err
	}
	where := fmt.Sprintf("throwaway PostgreSQL (%s) at %s, removed at exit", srv.Kind(), pgserver.Redact(srv.DSN()))
	if srv.Kind() == "env" {
		where = fmt.Sprintf("PostgreSQL from %s at %s", pgserver.EnvDatabaseURL, pgserver.Redact(srv.DSN()))
	}
	return srv.DSN(), where, srv.Close, nil
}

// migrate creates the lease table if it is missing, as every replica of a
// real service would at start-up (Migrate is safe to run concurrently).
func migrate(ctx context.Context, dsn, table string) error {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return fmt.Errorf("connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	if err := pglease.Migrate(ctx, conn, pglease.WithTable(table)); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	return nil
}

// layout names the replicas and gives each its clock's lag and its start
// moment.
//
// In one process the lags are spread evenly over [0, skew], in an order
// drawn from the seed: evenly, so that the replicas' claims of a tick
// reach the database far enough apart to show double runs with -min-hold 0;
// shuffled, so that which replica leads changes with -seed. The start
// moments are random, and the first replica starts at once: each replica
// starts a whole number of periods after the first possible moment (the
// numbers shuffled, so that replicas join while others run), plus its own
// slot of the period (the slots in a random order), plus a random quarter
// of a slot, less its lag. The phases of the replicas'
// claims (start plus lag) are then spread over the period, as those of
// replicas started independently usually are, rather than bunched by
// chance, so that with -schedule immediately their ticks are out of phase
// for sure.
//
// A lone -replica starts with its process, and draws its lag from the seed
// and its name, so that terminals differ.
func layout(cfg config) (names []string, lags, starts []time.Duration) {
	if cfg.replica != "" {
		rng := rand.New(rand.NewPCG(cfg.seed, fnv64(cfg.replica)))
		return []string{cfg.replica}, []time.Duration{time.Duration(rng.Int64N(int64(cfg.skew) + 1))}, []time.Duration{0}
	}
	n := cfg.replicas
	rng := rand.New(rand.NewPCG(cfg.seed, 0))
	names = make([]string, n)
	lags = make([]time.Duration, n)
	starts = make([]time.Duration, n)
	for i, slot := range rng.Perm(n) {
		names[i] = fmt.Sprintf("replica-%d", i+1)
		if n > 1 {
			lags[i] = cfg.skew * time.Duration(slot) / time.Duration(n-1)
		}
	}
	if cfg.startSpread == 0 {
		return names, lags, starts // all at once
	}
	// Whole periods within the spread (at least 1), shuffled, so that the
	// replicas join in different ticks while the first ones run.
	periods := rng.Perm(int(cfg.startSpread / cfg.period))
	for i, slot := range rng.Perm(n) {
		phase := time.Duration((float64(slot) + rng.Float64()/4) / float64(n) * float64(cfg.period))
		phase = (phase - lags[i]%cfg.period + cfg.period) % cfg.period
		starts[i] = time.Duration(periods[i%len(periods)])*cfg.period + phase
	}
	first := slices.Min(starts)
	for i := range starts {
		starts[i] -= first
	}
	return names, lags, starts
}

// base returns t0, the time ticks are counted from (tick k is scheduled at
// t0 + k*period on every replica: a multiple of the period since the Unix
// epoch, where pglease.StartOnGrid puts it), and the first tick counted.
//
// In one process, t0 is the first multiple at least lead after the first
// replica's start, and the first tick is 0. With -replica each terminal
// is a process of its own, and they must agree on tick numbers without
// talking to each other: t0 is then the last multiple at or before the
// start of the current hour, the same in every process, and the first
// tick the first multiple at least lead after this process's start.
func base(cfg config, now time.Time) (time.Time, int64) {
	if cfg.replica == "" {
		return gridCeil(now.Add(lead), cfg.period), 0
	}
	t0 := gridFloor(now.Truncate(time.Hour), cfg.period)
	return t0, floorDiv(gridCeil(now.Add(lead), cfg.period).Sub(t0), cfg.period)
}

// gridFloor is the last multiple of period since the Unix epoch at or
// before t.
func gridFloor(t time.Time, period time.Duration) time.Time {
	off := time.Duration(t.UnixNano() % int64(period))
	if off < 0 {
		off += period
	}
	return t.Round(0).Add(-off)
}

// gridCeil is the first multiple of period since the Unix epoch at or
// after t.
func gridCeil(t time.Time, period time.Duration) time.Time {
	f := gridFloor(t, period)
	if f.Equal(t) {
		return f
	}
	return f.Add(period)
}

// floorDiv is d / p rounded down, also for negative d.
func floorDiv(d, p time.Duration) int64 {
	k := int64(d / p)
	if d < 0 && d%p != 0 {
		k--
	}
	return k
}

// latency is what the demo adds to the skew in the spread of the claims
// of one tick: the spread of their latencies, on one machine.
const latency = 10 * time.Millisecond

// conditions says whether each tick must run exactly once, in the terms
// of README's "Each tick exactly once": ticks aligned on every replica,
// and, with D the spread of the claims around their tick (the skew plus
// latency), D < min hold, min hold + D <= period, and the longest run + D
// <= period.
type conditions struct {
	holds bool
	lines []string // each condition with its figures
}

func promise(cfg config) conditions {
	d := cfg.skew + latency
	longest := maxWork(cfg.period)
	c := conditions{holds: true}
	check := func(ok bool, format string, args ...any) {
		line := fmt.Sprintf(format, args...)
		if !ok {
			line += "   NOT MET"
			c.holds = false
		}
		c.lines = append(c.lines, line)
	}
	if cfg.ticks {
		// Each claim takes the tick nearest the server's clock: the
		// replicas agree on it while their claims are within half a
		// period of it.
		check(d < cfg.period/2, "D < period / 2:          %v < %v", d, cfg.period/2)
		return c
	}
	check(cfg.schedule == onGrid, "ticks aligned:           -schedule %s", cfg.schedule)
	check(d < cfg.minHold, "D < min hold:            %v < %v", d, cfg.minHold)
	check(cfg.minHold+d <= cfg.period, "min hold + D <= period:  %v <= %v", cfg.minHold+d, cfg.period)
	check(longest+d <= cfg.period, "run + D <= period:       %v <= %v", longest+d, cfg.period)
	return c
}

func printHeader(w io.Writer, cfg config, where string, reps []*replica, kill bool) {
	if cfg.replica != "" {
		fmt.Fprintf(w, "pglease demo: replica %s of a gocron scheduler; start others in other terminals with the same -dsn and another -replica\n", cfg.replica)
	} else {
		fmt.Fprintf(w, "pglease demo: %d replicas of a gocron scheduler in one process, each with its own pool and pglease.Locker\n", len(reps))
	}
	fmt.Fprintf(w, "  database  %s\n", where)
	schedule := "on the period's grid, claiming ticks with catch-up (pglease.WithPeriod, WithCatchUp: README's quick start)"
	switch {
	case !cfg.ticks && cfg.schedule == onGrid:
		schedule = "on the period's grid (pglease.StartOnGrid: the timing-only way)"
	case !cfg.ticks:
		schedule = "from each replica's start (gocron.WithStartImmediately, the former quick start)"
	}
	fmt.Fprintf(w, "  job       %q every %v %s, %v to %v of work, lease table %s\n",
		jobName, cfg.period, schedule, leastWork, maxWork(cfg.period), cfg.table)
	hold := cfg.minHold.String()
	if cfg.minHold == 0 {
		hold = "off"
	}
	fmt.Fprintf(w, "  leases    TTL %v, heartbeat every %v, min hold %s\n", cfg.ttl, (cfg.ttl / 3).Round(time.Millisecond), hold)
	starts := make([]string, len(reps))
	clocks := make([]string, len(reps))
	for i, r := range reps {
		starts[i] = r.name + " " + startString(r.startAt)
		clocks[i] = r.name + " " + lagString(r.lag)
	}
	if cfg.replica != "" {
		fmt.Fprintf(w, "  starts    with this process\n")
	} else {
		fmt.Fprintf(w, "  starts    %s (random moments, seed %d)\n", strings.Join(starts, ", "), cfg.seed)
	}
	fmt.Fprintf(w, "  clocks    %s (simulated: a replica's claims reach the database as late as its clock is slow)\n", strings.Join(clocks, ", "))
	c := promise(cfg)
	if cfg.ticks {
		fmt.Fprintf(w, "  once      each tick runs at most once, and exactly once while a replica is free, when, with D = skew %v + claim latency %v:\n", cfg.skew, latency)
	} else {
		fmt.Fprintf(w, "  once      each tick runs exactly once when, with D = skew %v + claim latency %v:\n", cfg.skew, latency)
	}
	for _, line := range c.lines {
		fmt.Fprintf(w, "              %s\n", line)
	}
	switch {
	case c.holds && cfg.ticks && cfg.replica == "":
		fmt.Fprintln(w, "            it holds: the demo fails if a tick completes twice, is missed other than while the killed run holds the key, or the killed run's tick is not caught up once")
	case c.holds && cfg.replica != "":
		fmt.Fprintln(w, "            they hold: across the processes, each tick runs once (each process sees only its own runs)")
	case c.holds:
		fmt.Fprintln(w, "            they hold: the demo fails if a tick runs twice, or is missed other than while failing over")
	default:
		fmt.Fprintln(w, "            they do not all hold: expect ticks run twice, or missed")
	}
	switch {
	case kill && cfg.ticks:
		fmt.Fprintf(w, "  kill      at tick 0 + %v the replica running the job is killed mid-run; its lease lapses within its TTL, and another replica catches its tick up\n",
			cfg.duration*2/5)
	case kill:
		fmt.Fprintf(w, "  kill      at tick 0 + %v the replica running the job is killed mid-run; the others wait out its TTL\n",
			cfg.duration*2/5)
	}
	fmt.Fprintln(w)
}

// syncWriter serializes writes to w.
type syncWriter struct {
	mu sync.Mutex
	w  io.Writer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}
