// Command replicas shows pglease keeping a gocron job to one run per tick
// across several replicas, and what happens when the replica running it
// dies.
//
// With no configuration it starts a throwaway PostgreSQL (or uses
// PGLEASE_DATABASE_URL), runs three replicas of a gocron scheduler in one
// process, each with its own pool and its own pglease.Locker, all scheduling
// the same job every second with start times up to 300ms apart. Midway it
// kills the replica that is running the job, mid-run and without releasing
// its lease, as a crash would; the others take over once the lease's TTL has
// passed. It prints a timeline, then a summary, and exits 1 if a tick ran
// twice while the min hold was on.
//
//	go run ./examples/replicas
//	go run ./examples/replicas -min-hold 0       # gocron issue 841: double runs
//	go run ./examples/replicas -dsn postgres://... -replica a   # one replica per terminal
package main

import (
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
// code: 0, 1 when a tick ran twice with the min hold on (or the demo could
// not run), 2 for bad flags.
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
	dsn      string
	replicas int
	replica  string // non-empty: run only this replica, for one terminal each
	duration time.Duration
	period   time.Duration
	ttl      time.Duration
	minHold  time.Duration
	skew     time.Duration
	seed     uint64
	table    string
}

// defaultMinHold is half the period, at most the TTL: long enough to cover
// the start skew between replicas, short enough to free the key well
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
	fs.DurationVar(&cfg.ttl, "ttl", 3*time.Second, "lease TTL: how long the others wait after a replica dies (heartbeat every TTL/3)")
	fs.Func("min-hold", "keep a released lease held until `duration` after its claim; 0 turns it off (default: half the period, at most the TTL)", func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return err
		}
		cfg.minHold, minHoldSet = d, true
		return nil
	})
	fs.DurationVar(&cfg.skew, "skew", 300*time.Millisecond, "replicas' first runs are spread over this much after the common start")
	fs.Uint64Var(&cfg.seed, "seed", 1, "seed for the order of the replicas' start offsets and the job's durations")
	fs.StringVar(&cfg.table, "table", "pglease_demo", "lease table (created if missing)")
	if err := fs.Parse(args); err != nil {
		return cfg, err
	}
	if fs.NArg() > 0 {
		return cfg, fmt.Errorf("unexpected arguments: %q", fs.Args())
	}
	if !minHoldSet {
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
	case cfg.replica == "" && cfg.replicas < 1:
		return cfg, fmt.Errorf("-replicas %d: must be at least 1", cfg.replicas)
	case cfg.replica == "" && cfg.duration < cfg.period:
		return cfg, fmt.Errorf("-duration %v: must be at least one period (%v)", cfg.duration, cfg.period)
	case cfg.duration < 0:
		return cfg, fmt.Errorf("-duration %v: must not be negative", cfg.duration)
	}
	return cfg, nil
}

// lead is how far ahead of now the first tick is scheduled, so that every
// scheduler is started before it.
const lead = 250 * time.Millisecond

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

	names, offsets := layout(cfg)
	lastOffset := slices.Max(offsets)
	tl := newTimeline(stdout, cfg.period, cfg.ttl, names)
	var kill *killSwitch
	if cfg.replica == "" && len(names) > 1 {
		kill = &killSwitch{}
	}
	// pglease's own log, at warn level: a lost lease or a failed claim
	// shows, contention between replicas does not. No time: the timeline
	// has it.
	logger := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{
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
				fmt.Fprintf(stderr, "replicas: stopping %s: %v\n", r.name, err)
			}
		}
	}
	defer stopAll() // on the error paths; a no-op after the regular stop
	for i, name := range names {
		r, err := newReplica(ctx, cfg, name, offsets[i], dsn, tl, kill, logger, cfg.seed)
		if err != nil {
			return summary{}, fmt.Errorf("%s: %w", name, err)
		}
		reps = append(reps, r)
	}

	t0, firstTick := base(cfg, time.Now())
	tl.setBase(t0, firstTick)
	if kill != nil {
		kill.at = tl.origin.Add(cfg.duration * 2 / 5)
	}
	printHeader(stdout, cfg, where, reps, kill != nil)
	tl.header()
	for _, r := range reps {
		if err := r.start(cfg.period, tl.origin); err != nil {
			return summary{}, fmt.Errorf("%s: %w", r.name, err)
		}
	}

	// A tick is complete once the last replica's timer has fired for it,
	// plus half the quiet time before the next tick (settle) for its run to
	// end: the demo stops then, and counts only complete ticks.
	settle := (cfg.period - lastOffset) / 2
	completeBy := func(at time.Time) int64 {
		last := floorDiv(at.Sub(t0.Add(lastOffset+settle)), cfg.period)
		return max(0, last-firstTick+1)
	}
	var deadline <-chan time.Time
	if cfg.duration > 0 {
		ticks := int64(cfg.duration / cfg.period)
		stopAt := t0.Add(time.Duration(firstTick+ticks-1)*cfg.period + lastOffset + settle)
		timer := time.NewTimer(time.Until(stopAt))
		defer timer.Stop()
		deadline = timer.C
	}
	select {
	case <-deadline:
	case <-ctx.Done():
		fmt.Fprintln(stdout, "interrupted: stopping the replicas")
	}
	ticks := completeBy(time.Now())
	stopAll()

	sum := tl.summarize(firstTick, ticks, cfg.minHold)
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

// layout names the replicas and gives each its start offset. In one
// process the offsets are spread evenly over [0, skew], in an order drawn
// from the seed: evenly, so that the replicas' timers fire far enough
// apart to show double runs with -min-hold 0; shuffled, so that which
// replica leads changes with -seed. A lone -replica draws its offset from
// the seed and its name, so that terminals differ.
func layout(cfg config) ([]string, []time.Duration) {
	if cfg.replica != "" {
		rng := rand.New(rand.NewPCG(cfg.seed, fnv64(cfg.replica)))
		return []string{cfg.replica}, []time.Duration{time.Duration(rng.Int64N(int64(cfg.skew) + 1))}
	}
	rng := rand.New(rand.NewPCG(cfg.seed, 0))
	names := make([]string, cfg.replicas)
	offsets := make([]time.Duration, cfg.replicas)
	for i, slot := range rng.Perm(cfg.replicas) {
		names[i] = fmt.Sprintf("replica-%d", i+1)
		if cfg.replicas > 1 {
			offsets[i] = cfg.skew * time.Duration(slot) / time.Duration(cfg.replicas-1)
		}
	}
	return names, offsets
}

// base returns t0, the time ticks are counted from (tick k is scheduled at
// t0 + k*period; each replica runs it at its own offset after that), and
// the first tick to run.
//
// In one process, t0 is just ahead of now and the first tick is 0. With
// -replica each terminal is a process of its own, and they must agree on
// t0 without talking to each other: t0 is then the start of the current
// hour moved down onto the period's grid (multiples of the period since
// Go's zero time, the same in every process), and the first tick is the
// next one on that grid. Tick numbers then match across terminals.
func base(cfg config, now time.Time) (time.Time, int64) {
	if cfg.replica == "" {
		return now.Add(lead), 0
	}
	t0 := now.Truncate(time.Hour).Truncate(cfg.period)
	first := floorDiv(now.Add(lead).Sub(t0)+cfg.period-1, cfg.period)
	return t0, first
}

// floorDiv is d / p rounded down, also for negative d.
func floorDiv(d, p time.Duration) int64 {
	k := int64(d / p)
	if d < 0 && d%p != 0 {
		k--
	}
	return k
}

func printHeader(w io.Writer, cfg config, where string, reps []*replica, kill bool) {
	if cfg.replica != "" {
		fmt.Fprintf(w, "pglease demo: replica %s of a gocron scheduler; start others in other terminals with the same -dsn and another -replica\n", cfg.replica)
	} else {
		fmt.Fprintf(w, "pglease demo: %d replicas of a gocron scheduler in one process, each with its own pool and pglease.Locker\n", len(reps))
	}
	fmt.Fprintf(w, "  database  %s\n", where)
	fmt.Fprintf(w, "  job       %q every %v (a few ms to %v of work), lease table %s\n", jobName, cfg.period, reps[0].maxWork, cfg.table)
	hold := cfg.minHold.String()
	if cfg.minHold == 0 {
		hold = "off"
	}
	fmt.Fprintf(w, "  leases    TTL %v, heartbeat every %v, min hold %s\n", cfg.ttl, (cfg.ttl / 3).Round(time.Millisecond), hold)
	starts := make([]string, len(reps))
	for i, r := range reps {
		starts[i] = r.name + " " + offsetString(r.offset)
	}
	fmt.Fprintf(w, "  starts    %s (seed %d)\n", strings.Join(starts, ", "), cfg.seed)
	if cfg.minHold > 0 && cfg.minHold <= cfg.skew {
		fmt.Fprintf(w, "  note      min hold %v does not cover the start skew %v: expect double runs\n", cfg.minHold, cfg.skew)
	}
	if kill {
		fmt.Fprintf(w, "  kill      at %v the replica running the job is killed mid-run; the others wait out its TTL\n",
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
