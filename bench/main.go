// Command bench runs pglease's storage study and heartbeat scaling study on
// a durable private PostgreSQL (fsync, synchronous_commit and autovacuum
// on), and writes their tables, CSV data and SVG plots:
//
//	go run ./bench             # the full study, written to docs/bench
//	go run ./bench -quick -out "$(mktemp -d)"   # a short run, for CI
//	go run ./bench -fleet      # the fleet study alone
//	go run ./bench -common     # the common-path study alone
//	go run ./bench -common -common-workers 4 -common-contended=false   # one of its cases
//	go run ./bench -followers  # the followers study alone
//
// The storage study runs a fixed number of claim/release cycles over a few
// keys, releasing either by expiring the row in place (pglease) or by
// DELETE (and a fresh INSERT on the next claim), and samples the table's
// size, dead tuples, HOT updates, WAL and vacuums every 1% of the cycles.
// The heartbeat study times one round of pglease's batched heartbeat
// against one UPDATE per lease, for 1 to 10,000 leases. The fleet study
// runs ticks where every replica of a fleet calls Lock for each of J jobs at
// the same instant, with pglease's coalesced claims and with one claim
// statement per Lock. The common-path study runs job runs (Claim + Unlock,
// W = 1, 4, 16 workers) and a contended key (8 replicas, one key) through a
// Locker, with today's statements sent raw, and with the statements before
// the hardening sent raw, in turns, and reads what a losing claim costs.
// The followers study counts the statements of follower Electors waiting
// for a held leader key, on a direct connection, through PgBouncer in
// transaction mode (polling), and through it with WithListenDSN.
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/bench/internal/lab"
)

var quiet = slog.New(slog.DiscardHandler)

type settings struct {
	quick  bool
	out    string
	cycles int
	keys   int
	sizes  []int
	reps   int

	replicas  int   // fleet study: replicas
	jobs      []int // fleet study: jobs due together
	ticks     int   // fleet study: ticks per style and size
	fleetOnly bool

	commonOnly   bool
	workers      []int         // common-path study: workers of a job run
	contended    bool          // common-path study: the contended key too
	slice        time.Duration // common-path study: one turn of a variant
	commonRounds int           // common-path study: turns of each variant

	followersOnly  bool
	followers      int           // followers study: follower Electors per path
	followerWindow time.Duration // followers study: how long they are counted
}

func main() {
	var s settings
	flag.BoolVar(&s.quick, "quick", false, "a short run (for CI): fewer cycles, heartbeat sizes up to 1,000")
	flag.StringVar(&s.out, "out", filepath.Join("docs", "bench"), "directory for results.md, the CSV files and the SVG plots")
	flag.IntVar(&s.cycles, "cycles", 0, "claim/release cycles per release style (default 200000, or 5000 with -quick)")
	flag.IntVar(&s.keys, "keys", 50, "keys the cycles go round")
	flag.IntVar(&s.replicas, "replicas", 10, "replicas of the fleet study, each with its own pool and Locker")
	flag.BoolVar(&s.fleetOnly, "fleet", false, "run the fleet study alone, and write only its results (fleet.md, fleet.csv and its plots)")
	flag.BoolVar(&s.commonOnly, "common", false, "run the common-path study alone, and write only its results (common.md, common.csv)")
	flag.BoolVar(&s.followersOnly, "followers", false, "run the followers study alone (needs pgbouncer), and write only its results (followers.md)")
	flag.IntVar(&s.followers, "follower-count", 5, "follower Electors per path of the followers study")
	flag.DurationVar(&s.followerWindow, "follower-window", time.Minute, "how long the followers study counts each path's statements (10s with -quick)")
	workers := flag.String("common-workers", "1,4,16", "common-path study: the workers W of its job-run cases, comma-separated")
	flag.BoolVar(&s.contended, "common-contended", true, "common-path study: measure the contended key too")
	flag.Parse()
	if s.quick && s.followerWindow == time.Minute {
		s.followerWindow = 10 * time.Second
	}
	s.slice, s.commonRounds = 2*time.Second, 7
	for _, w := range strings.Split(*workers, ",") {
		n, err := strconv.Atoi(strings.TrimSpace(w))
		if err != nil || n < 1 {
			fmt.Fprintf(os.Stderr, "bench: -common-workers %q: each must be a count of workers, 1 or more\n", *workers)
			os.Exit(2)
		}
		s.workers = append(s.workers, n)
	}
	if s.quick {
		s.slice, s.commonRounds = 200*time.Millisecond, 1
	}
	s.sizes, s.reps = []int{1, 10, 100, 1000, 10000}, 3
	s.jobs, s.ticks = []int{1, 10, 50, 100, 200, 500}, 15
	if s.quick {
		s.sizes, s.reps = []int{1, 10, 100, 1000}, 1
		s.jobs, s.ticks = []int{10, 200}, 2
	}
	if s.cycles == 0 {
		s.cycles = 200000
		if s.quick {
			s.cycles = 5000
		}
	}
	if s.cycles < 1 || s.keys < 1 {
		fmt.Fprintln(os.Stderr, "bench: -cycles and -keys must be positive")
		os.Exit(2)
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	err := run(ctx, s)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "bench:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, s settings) error {
	started := time.Now()
	logf := func(format string, args ...any) {
		fmt.Printf("[%6.1fs] %s\n", time.Since(started).Seconds(), fmt.Sprintf(format, args...))
	}
	db, err := lab.Start(ctx, s.out)
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	env, err := describe(ctx, pool)
	if err != nil {
		return err
	}
	logf("%s PostgreSQL %s, fsync=%s synchronous_commit=%s autovacuum=%s (naptime %s)",
		db.Kind(), env.PG, env.Fsync, env.SyncCommit, env.Autovacuum, env.Naptime)

	if s.followersOnly {
		return runFollowers(ctx, s, db.DSN(), logf)
	}

	stats, err := pgx.Connect(ctx, db.DSN())
	if err != nil {
		return err
	}
	defer func() { _ = stats.Close(context.Background()) }()
	postmaster := lab.PostmasterPID(ctx, pool)

	cases := fmt.Sprintf("job runs at W = %v", s.workers)
	if s.contended {
		cases += " and a contended key"
	}
	logf("common-path study: %s, %d turns of %v per variant", cases, s.commonRounds, s.slice)
	common, losing, err := studyCommon(ctx, stats, db.DSN(), postmaster, s.workers, s.contended, s.slice, s.commonRounds)
	if err != nil {
		return fmt.Errorf("common-path study: %w", err)
	}
	for _, p := range common {
		logf("  %-27s %-8s %8.0f runs/s, client CPU %5.0f µs/run, %4.0f allocs/run, %4.2f statements/run, server CPU %6.0f µs/run, %5.2f WAL flushes/run, %5.2f xids/run",
			p.Case, p.Variant, p.Runs, p.ClientCPU, p.Allocs, p.Statements, p.CPU, p.WALSyncs, p.XIDs)
	}
	commonReport := commonMarkdown(common, losing, s.slice, s.commonRounds)
	if err := writeCommonCSV(filepath.Join(s.out, "common.csv"), common); err != nil {
		return err
	}
	if s.commonOnly {
		if err := os.WriteFile(filepath.Join(s.out, "common.md"), []byte(commonReport), 0o644); err != nil {
			return err
		}
		fmt.Print(commonReport)
		logf("done; wrote common.md, common.csv to %s", s.out)
		return nil
	}

	logf("fleet study: %d replicas x %v jobs due together, %d ticks each", s.replicas, s.jobs, s.ticks)
	ticks, err := studyFleet(ctx, stats, db.DSN(), postmaster, s.replicas, s.jobs, s.ticks)
	if err != nil {
		return fmt.Errorf("fleet study: %w", err)
	}
	for _, t := range ticks {
		logf("  %-25s %4d jobs: tick %8.2f ms, Lock p50 %7.2f ms p99 %7.2f ms, %6.1f claim statements, %5.1f xids, %5.1f WAL flushes, server CPU %7.1f ms",
			t.Style, t.Jobs, t.Tick.Seconds()*1000, t.P50.Seconds()*1000, t.P99.Seconds()*1000, t.Statements, t.XIDs, t.WALSyncs, t.CPU*1000)
	}

	if s.fleetOnly {
		if err := plotFleet(s.out, ticks); err != nil {
			return fmt.Errorf("plotting: %w", err)
		}
		if err := writeFleetCSV(s.out, ticks); err != nil {
			return err
		}
		report := fleetMarkdown(ticks)
		if err := os.WriteFile(filepath.Join(s.out, "fleet.md"), []byte(report), 0o644); err != nil {
			return err
		}
		fmt.Print(report)
		logf("done; wrote fleet.md, fleet.csv, fleet_tick.svg, fleet_cpu.svg to %s", s.out)
		return nil
	}

	logf("heartbeat study: %v leases", s.sizes)
	beats, err := studyHeartbeat(ctx, pool, s.sizes, s.reps)
	if err != nil {
		return fmt.Errorf("heartbeat study: %w", err)
	}
	for _, b := range beats {
		logf("  %-40s %6d leases: %10.3f ms/round", b.Style, b.Leases, b.Round.Seconds()*1000)
	}

	logf("storage study: %d cycles over %d keys for each release style", s.cycles, s.keys)
	runs, err := studyStorage(ctx, db.DSN(), s.cycles, s.keys, func(msg string) { logf("  %s", msg) })
	if err != nil {
		return fmt.Errorf("storage study: %w", err)
	}

	if err := plotStorage(s.out, runs); err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	if err := plotDeadTuples(s.out, runs); err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	if err := plotHeartbeat(s.out, beats); err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	if err := plotFleet(s.out, ticks); err != nil {
		return fmt.Errorf("plotting: %w", err)
	}
	if err := writeCSV(s.out, runs, beats); err != nil {
		return err
	}
	if err := writeFleetCSV(s.out, ticks); err != nil {
		return err
	}
	report := markdown(env, s, runs, beats) + commonReport + fleetMarkdown(ticks)
	if err := os.WriteFile(filepath.Join(s.out, "results.md"), []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Print("\n" + report)
	logf("done; wrote results.md, storage.csv, heartbeat.csv, fleet.csv, common.csv, storage.svg, dead_tuples.svg, heartbeat.svg, fleet_tick.svg, fleet_cpu.svg to %s", s.out)
	return nil
}
