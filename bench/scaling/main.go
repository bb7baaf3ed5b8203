// Command scaling measures what one durable PostgreSQL primary spends on
// pglease's workload: claims per second at full speed, and, for a number of
// Lockers each holding a number of leases with a heartbeat every second,
// the server's CPU, statements (transactions) per second and WAL per second.
// docs/SCALING.md reads its figures; it writes a table, a CSV file and two
// SVG plots:
//
//	go run ./bench/scaling                      # the study, written to docs/scaling
//	go run ./bench/scaling -quick -out "$(mktemp -d)"   # a short run
//
// The server's CPU is the user and system time of its postmaster and every
// child process, read from /proc (Linux), over the measured interval.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/lab"
)

// point is one measured configuration.
type point struct {
	Lockers, LeasesEach int
	Seconds             float64
	CPU                 float64 // server CPU, in cores (1.0 = one core busy)
	StatementsPerSec    float64 // statements the Lockers sent per second
	RowsPerSec          float64 // lease rows extended per second
	WALPerSec           float64 // bytes
}

func main() {
	quick := flag.Bool("quick", false, "a short run: fewer and smaller configurations")
	out := flag.String("out", filepath.Join("docs", "scaling"), "directory for scaling.csv and the SVG plots")
	flag.Parse()
	if err := run(*quick, *out); err != nil {
		fmt.Fprintln(os.Stderr, "scaling:", err)
		os.Exit(1)
	}
}

func run(quick bool, out string) error {
	ctx := context.Background()
	lockers, leases, measure := []int{1, 4, 16, 64}, []int{10, 100, 1000}, 5*time.Second
	claimFor := 5 * time.Second
	if quick {
		lockers, leases, measure, claimFor = []int{1, 4}, []int{10, 100}, 2*time.Second, time.Second
	}
	db, err := lab.Start(ctx, out)
	if err != nil {
		return err
	}
	defer db.Close()
	pool := db.Pool
	var version string
	if err := pool.QueryRow(ctx, "SHOW server_version").Scan(&version); err != nil {
		return err
	}
	fmt.Printf("PostgreSQL %s, durable (fsync, synchronous_commit on), %s\n", version, db.Kind())

	perSec, walPerClaim, err := claimRate(ctx, pool, db.DSN(), 8, claimFor)
	if err != nil {
		return fmt.Errorf("claim rate: %w", err)
	}
	fmt.Printf("claims: %.0f/s from 8 connections (new keys, one commit each), %.0f bytes of WAL per claim\n", perSec, walPerClaim)

	var points []point
	for _, l := range lockers {
		for _, n := range leases {
			p, err := measureHeld(ctx, pool, db.DSN(), l, n, measure)
			if err != nil {
				return fmt.Errorf("%d lockers x %d leases: %w", l, n, err)
			}
			fmt.Printf("%3d lockers x %5d leases (heartbeat 1 s): server CPU %.2f cores, %.0f statements/s, %.0f rows/s extended, %.0f kB/s WAL\n",
				p.Lockers, p.LeasesEach, p.CPU, p.StatementsPerSec, p.RowsPerSec, p.WALPerSec/1000)
			points = append(points, p)
		}
	}
	if err := writeCSV(filepath.Join(out, "scaling.csv"), points); err != nil {
		return err
	}
	if err := plotPoints(filepath.Join(out, "scaling_cpu.svg"), "Server CPU with every lease heartbeating once a second", "server CPU (cores)",
		lockers, points, func(p point) float64 { return p.CPU }); err != nil {
		return err
	}
	return plotPoints(filepath.Join(out, "scaling_statements.svg"), "Statements per second with every lease heartbeating once a second", "statements/s",
		lockers, points, func(p point) float64 { return p.StatementsPerSec })
}

// counter counts the statements sent through the pools it traces: the
// server's own counters (pg_stat_database) are flushed up to seconds late.
type counter struct{ n atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// counters are the server-wide figures sampled before and after a
// measurement.
type counters struct {
	at  time.Time
	cpu float64 // seconds
	wal int64
}

func sample(ctx context.Context, pool *pgxpool.Pool, postmaster int) (counters, error) {
	c := counters{at: time.Now()}
	if err := pool.QueryRow(ctx, `SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint`).Scan(&c.wal); err != nil {
		return c, err
	}
	if c.cpu = lab.ServerCPU(postmaster); c.cpu < 0 {
		return c, errors.New("the server's CPU time cannot be read from /proc: not a local server on Linux")
	}
	return c, nil
}

// claimRate claims fresh keys from workers connections for d and returns
// claims per second and WAL bytes per claim.
func claimRate(ctx context.Context, pool *pgxpool.Pool, dsn string, workers int, d time.Duration) (float64, float64, error) {
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("claims")); err != nil {
		return 0, 0, err
	}
	pm := lab.PostmasterPID(ctx, pool)
	before, err := sample(ctx, pool, pm)
	if err != nil {
		return 0, 0, err
	}
	var (
		n    atomic.Int64
		wg   sync.WaitGroup
		errs = make(chan error, workers)
	)
	stop := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			p, err := pgxpool.New(ctx, dsn)
			if err != nil {
				errs <- err
				return
			}
			defer p.Close()
			l := pglease.NewLocker(p, pglease.WithTable("claims"), pglease.WithHolder(fmt.Sprintf("w%d", w)),
				pglease.WithLogger(slog.New(slog.DiscardHandler)), pglease.WithTTL(time.Minute))
			defer l.Close(ctx)
			for i := 0; time.Now().Before(stop); i++ {
				if _, err := l.Claim(ctx, fmt.Sprintf("w%d-%d", w, i)); err != nil {
					errs <- err
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return 0, 0, err
	}
	after, err := sample(ctx, pool, pm)
	if err != nil {
		return 0, 0, err
	}
	secs := after.at.Sub(before.at).Seconds()
	return float64(n.Load()) / secs, float64(after.wal-before.wal) / float64(n.Load()), nil
}

// measureHeld starts lockers Lockers, each on a pool of its own (as replicas
// are), each claiming leasesEach keys, and measures the server while their
// heartbeats (every second) keep every lease for d.
func measureHeld(ctx context.Context, pool *pgxpool.Pool, dsn string, lockers, leasesEach int, d time.Duration) (point, error) {
	p := point{Lockers: lockers, LeasesEach: leasesEach}
	table := fmt.Sprintf("held_%d_%d", lockers, leasesEach)
	if err := pglease.Migrate(ctx, pool, pglease.WithTable(table)); err != nil {
		return p, err
	}
	pm := lab.PostmasterPID(ctx, pool)
	var (
		extended atomic.Int64
		sent     counter
	)
	hook := func(e pglease.Event) {
		if e.Kind == pglease.EventExtended {
			extended.Add(int64(e.Leases))
		}
	}
	type replica struct {
		pool   *pgxpool.Pool
		locker *pglease.Locker
	}
	reps := make([]replica, lockers)
	defer func() {
		for _, r := range reps {
			if r.locker != nil {
				_ = r.locker.Close(ctx)
			}
			if r.pool != nil {
				r.pool.Close()
			}
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, lockers)
	for i := range reps {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return p, err
		}
		cfg.MaxConns = 2
		cfg.ConnConfig.Tracer = &sent
		rp, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return p, err
		}
		l := pglease.NewLocker(rp, pglease.WithTable(table), pglease.WithHolder(fmt.Sprintf("r%d", i)),
			pglease.WithLogger(slog.New(slog.DiscardHandler)), pglease.WithTTL(10*time.Second),
			pglease.WithHeartbeatInterval(time.Second), pglease.WithHook(hook))
		reps[i] = replica{rp, l}
		wg.Go(func() {
			for k := range leasesEach {
				if _, err := l.Claim(ctx, fmt.Sprintf("r%d-%d", i, k)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return p, err
	}
	before, err := sample(ctx, pool, pm)
	if err != nil {
		return p, err
	}
	ext0, sent0 := extended.Load(), sent.n.Load()
	time.Sleep(d) // the measured interval: the heartbeats run meanwhile
	after, err := sample(ctx, pool, pm)
	if err != nil {
		return p, err
	}
	secs := after.at.Sub(before.at).Seconds()
	p.Seconds = secs
	p.CPU = (after.cpu - before.cpu) / secs
	p.StatementsPerSec = float64(sent.n.Load()-sent0) / secs
	p.RowsPerSec = float64(extended.Load()-ext0) / secs
	p.WALPerSec = float64(after.wal-before.wal) / secs
	return p, nil
}

func writeCSV(path string, points []point) error {
	rows := [][]string{{"lockers", "leases_each", "seconds", "server_cpu_cores", "statements_per_s", "rows_extended_per_s", "wal_bytes_per_s"}}
	for _, p := range points {
		rows = append(rows, []string{strconv.Itoa(p.Lockers), strconv.Itoa(p.LeasesEach), fmt.Sprintf("%.2f", p.Seconds),
			fmt.Sprintf("%.3f", p.CPU), fmt.Sprintf("%.1f", p.StatementsPerSec), fmt.Sprintf("%.0f", p.RowsPerSec), fmt.Sprintf("%.0f", p.WALPerSec)})
	}
	return lab.WriteCSV(path, rows)
}

// plotPoints draws y against the total number of leases, one line per
// number of Lockers.
func plotPoints(path, title, ylabel string, lockers []int, points []point, y func(point) float64) error {
	p := lab.NewPlot(title, "leases held in all (log scale)", ylabel)
	p.X.Scale, p.X.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	var lines []any
	for _, l := range lockers {
		var xy plotter.XYs
		for _, pt := range points {
			if pt.Lockers == l {
				xy = append(xy, plotter.XY{X: float64(pt.Lockers * pt.LeasesEach), Y: y(pt)})
			}
		}
		lines = append(lines, fmt.Sprintf("%d Lockers", l), xy)
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return lab.SaveSVG(p, path)
}
