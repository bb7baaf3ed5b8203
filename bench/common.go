package main

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/lab"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// The variants of the common-path study.
const (
	viaLocker  = "pglease"
	rawNow     = "raw"
	rawF1d3080 = "before" // the statements before the hardening (sqlstmt.BaselineUnhardened*)
)

// commonPoint is what one variant cost in one case of the common-path
// study: job runs per second (the median of its slices), and per job run
// the client's CPU and allocations, the statements sent, and the server's
// CPU, WAL flushes and transaction ids.
type commonPoint struct {
	Case       string
	Variant    string
	Workers    int
	Runs       float64 // job runs per second, median of the slices
	ClientCPU  float64 // this process's CPU microseconds per job run
	Allocs     float64 // this process's heap allocations per job run
	Statements float64 // statements sent per job run
	CPU        float64 // server CPU microseconds per job run; negative when unknown
	WALSyncs   float64 // per job run
	XIDs       float64 // per job run
}

// losingCost is what one losing claim of a statement costs the server.
type losingCost struct {
	Variant  string
	XID      bool
	WALBytes int64
}

// attempt is one try of a worker: a claim and, when it won, its release.
type attempt func(ctx context.Context, worker int) (won bool, err error)

// studyCommon measures the common path, side by side in one run: a job run
// (Claim + Unlock of a worker's own key, W workers) and a contended key
// (8 replicas retrying one key, releasing at once when they win), each
// through a Locker, with today's statements sent raw, and with the
// statements before the hardening sent raw. The variants of a case take
// turns in short slices, so that a noisy machine slows them alike. It also
// reads what a losing claim of each statement costs.
func studyCommon(ctx context.Context, stats *pgx.Conn, dsn string, postmaster int, workers []int, contended bool, slice time.Duration, rounds int) ([]commonPoint, []losingCost, error) {
	var out []commonPoint
	for _, w := range workers {
		points, err := measureCase(ctx, stats, dsn, postmaster, fmt.Sprintf("job run, W=%d", w), w, false, slice, rounds)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, points...)
	}
	if contended {
		points, err := measureCase(ctx, stats, dsn, postmaster, "contended key, 8 replicas", 8, true, slice, rounds)
		if err != nil {
			return nil, nil, err
		}
		out = append(out, points...)
	}
	losing, err := losingClaims(ctx, dsn)
	if err != nil {
		return nil, nil, err
	}
	return out, losing, nil
}

// measureCase sets the three variants of one case up, each on its own
// table and pool, runs them in turns and reports each.
func measureCase(ctx context.Context, stats *pgx.Conn, dsn string, postmaster int, name string, workers int, contended bool, slice time.Duration, rounds int) ([]commonPoint, error) {
	variants := []string{viaLocker, rawNow, rawF1d3080}
	tries := map[string]attempt{}
	pools := map[string]*pgxpool.Pool{}
	sends := map[string]*sent{}
	var cleanup []func()
	defer func() {
		for _, c := range slices.Backward(cleanup) {
			c()
		}
	}()
	for i, v := range variants {
		table := fmt.Sprintf("common_%d_%d", workers, i)
		if contended {
			table += "_contended"
		}
		sends[v] = newSent(table)
		pool, err := commonPool(ctx, dsn, int32(2*workers+2), sends[v])
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, pool.Close)
		pools[v] = pool
		if err := pglease.Migrate(ctx, pool, pglease.WithTable(table)); err != nil {
			return nil, err
		}
		try, closeVariant, err := newAttempt(pool, table, v, workers, contended)
		if err != nil {
			return nil, err
		}
		cleanup = append(cleanup, closeVariant)
		tries[v] = try
	}
	type acc struct {
		rates       []float64
		runs        int64
		cpu, client float64
		allocs      uint64
		syncs, xids int64
		cpuKnown    bool
	}
	got := map[string]*acc{}
	for _, v := range variants {
		got[v] = &acc{cpuKnown: true}
		if _, err := runSlice(ctx, tries[v], workers, slice/10); err != nil { // warm up
			return nil, fmt.Errorf("%s, %s: %w", name, v, err)
		}
	}
	for range rounds {
		for _, v := range variants {
			a := got[v]
			syncs0 := settledWALSyncs(ctx, stats, pools[v])
			cpu0, xids0 := lab.ServerCPU(postmaster), nextXID(ctx, stats)
			client0, allocs0 := clientCost()
			sends[v].on.Store(true)
			start := time.Now()
			runs, err := runSlice(ctx, tries[v], workers, slice)
			if err != nil {
				return nil, fmt.Errorf("%s, %s: %w", name, v, err)
			}
			elapsed := time.Since(start)
			sends[v].on.Store(false)
			client1, allocs1 := clientCost()
			a.client += client1 - client0
			a.allocs += allocs1 - allocs0
			cpu1, xids1 := lab.ServerCPU(postmaster), nextXID(ctx, stats)
			a.cpuKnown = a.cpuKnown && cpu0 >= 0 && cpu1 >= 0
			a.cpu += cpu1 - cpu0
			a.xids += xids1 - xids0
			a.syncs += settledWALSyncs(ctx, stats, pools[v]) - syncs0
			a.runs += runs
			a.rates = append(a.rates, float64(runs)/elapsed.Seconds())
		}
	}
	if err := checkStatements(sends[viaLocker].texts(), sends[rawNow].texts(), workers == 1 && !contended); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	var points []commonPoint
	for _, v := range variants {
		a := got[v]
		slices.Sort(a.rates)
		n := float64(max(a.runs, 1))
		cpu := a.cpu / n * 1e6
		if !a.cpuKnown {
			cpu = -1
		}
		points = append(points, commonPoint{
			Case: name, Variant: v, Workers: workers, Runs: a.rates[len(a.rates)/2],
			ClientCPU: a.client / n * 1e6, Allocs: float64(a.allocs) / n, Statements: float64(sends[v].total()) / n,
			CPU: cpu, WALSyncs: float64(a.syncs) / n, XIDs: float64(a.xids) / n,
		})
	}
	return points, nil
}

// clientCost is this process's CPU time so far, in seconds, and its heap
// allocations so far.
func clientCost() (cpu float64, allocs uint64) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err == nil {
		cpu = time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	}
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return cpu, m.Mallocs
}

// commonPool is a pool of conns connections whose statements tracer sees.
func commonPool(ctx context.Context, dsn string, conns int32, tracer pgx.QueryTracer) (*pgxpool.Pool, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = conns
	cfg.ConnConfig.Tracer = tracer
	return pgxpool.NewWithConfig(ctx, cfg)
}

// newAttempt builds variant's attempt for workers workers: each on its own
// key and holder (a job run), or all on one key, each with its own holder
// (contended). Through pglease, a job run has one Locker for all its
// workers (one replica running W jobs) and a contended key one Locker per
// replica.
func newAttempt(pool *pgxpool.Pool, table, variant string, workers int, contended bool) (attempt, func(), error) {
	key := func(w int) string {
		if contended {
			return "job"
		}
		return fmt.Sprintf("job-%d", w)
	}
	holder := func(w int) string {
		if contended {
			return fmt.Sprintf("replica-%d", w)
		}
		return "replica"
	}
	const ttl = 60.0
	switch variant {
	case viaLocker:
		lockers := make([]*pglease.Locker, workers)
		for w := range lockers {
			if w == 0 || contended {
				lockers[w] = pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(holder(w)),
					pglease.WithTTL(time.Minute), pglease.WithLogger(quiet))
			} else {
				lockers[w] = lockers[0]
			}
		}
		closeAll := func() {
			for w, l := range lockers {
				if w == 0 || contended {
					_ = l.Close(context.Background())
				}
			}
		}
		return func(ctx context.Context, w int) (bool, error) {
			lease, err := lockers[w].Claim(ctx, key(w))
			if errors.Is(err, pglease.ErrHeld) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			return true, lease.Unlock(ctx)
		}, closeAll, nil
	case rawNow:
		// What a Locker sends for a Claim and an Unlock alone.
		claim, release := render(sqlstmt.Claim, table), render(sqlstmt.ReleaseOne, table)
		return func(ctx context.Context, w int) (bool, error) {
			var fence int64
			err := pool.QueryRow(ctx, claim, key(w), holder(w), ttl).Scan(&fence, nil, nil, nil, nil, nil)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			return true, releaseLocked(ctx, func() (bool, error) {
				tag, err := pool.Exec(ctx, release, holder(w), key(w), fence, 0.0, "20ms")
				var pgErr *pgconn.PgError
				switch {
				case errors.As(err, &pgErr) && pgErr.Code == "55P03": // locked past the wait: again
					return false, nil
				case err == nil && tag.RowsAffected() == 0:
					return false, pgx.ErrNoRows
				}
				return err == nil, err
			})
		}, func() {}, nil
	case rawF1d3080:
		claim, release := render(sqlstmt.BaselineUnhardenedClaim, table), render(sqlstmt.BaselineUnhardenedRelease, table)
		return func(ctx context.Context, w int) (bool, error) {
			var fence int64
			err := pool.QueryRow(ctx, claim, key(w), holder(w), ttl).Scan(&fence, nil, nil, nil)
			if errors.Is(err, pgx.ErrNoRows) {
				return false, nil
			}
			if err != nil {
				return false, err
			}
			_, err = pool.Exec(ctx, release, key(w), holder(w), fence, 0.0)
			return true, err
		}, func() {}, nil
	}
	return nil, nil, fmt.Errorf("no variant %q", variant)
}

// releaseLocked sends a release (send) again while its row stays locked by
// another transaction past the release's lock wait, waiting 1ms, then twice
// as long each time up to 250ms, as a Locker does.
func releaseLocked(ctx context.Context, send func() (bool, error)) error {
	wait := time.Millisecond
	for {
		released, err := send()
		if errors.Is(err, pgx.ErrNoRows) {
			return errors.New("release found its lease lost")
		}
		if err != nil || released {
			return err
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(wait):
		}
		wait = min(2*wait, 250*time.Millisecond)
	}
}

// runSlice runs try on workers goroutines for d and returns the job runs
// (attempts that won).
func runSlice(ctx context.Context, try attempt, workers int, d time.Duration) (int64, error) {
	var (
		runs atomic.Int64
		wg   sync.WaitGroup
		errs = make([]error, workers)
	)
	deadline := time.Now().Add(d)
	for w := range workers {
		wg.Go(func() {
			for time.Now().Before(deadline) {
				won, err := try(ctx, w)
				if err != nil {
					errs[w] = err
					return
				}
				if won {
					runs.Add(1)
				}
			}
		})
	}
	wg.Wait()
	return runs.Load(), errors.Join(errs...)
}

// losingClaims reads, for today's claim and the claim before the
// hardening, whether a claim of a key another holder's live lease has gets
// a transaction id and how many bytes of WAL it writes (EXPLAIN's WAL
// counters count the statement alone).
func losingClaims(ctx context.Context, dsn string) ([]losingCost, error) {
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return nil, err
	}
	defer func() { _ = conn.Close(ctx) }()
	const table = "common_losing"
	if err := pglease.Migrate(ctx, conn, pglease.WithTable(table)); err != nil {
		return nil, err
	}
	if _, err := conn.Exec(ctx, render(sqlstmt.Claim, table), "job", "holder", 3600.0); err != nil {
		return nil, err
	}
	var out []losingCost
	for _, v := range []struct{ name, sql string }{{rawNow, sqlstmt.Claim}, {rawF1d3080, sqlstmt.BaselineUnhardenedClaim}} {
		c, err := losingCostOf(ctx, conn, render(v.sql, table))
		if err != nil {
			return nil, fmt.Errorf("losing claim, %s: %w", v.name, err)
		}
		c.Variant = v.name
		out = append(out, c)
	}
	return out, nil
}

func losingCostOf(ctx context.Context, conn *pgx.Conn, claim string) (losingCost, error) {
	tx, err := conn.Begin(ctx)
	if err != nil {
		return losingCost{}, err
	}
	defer func() { _ = tx.Rollback(ctx) }()
	var plan []map[string]any
	if err := tx.QueryRow(ctx, "EXPLAIN (ANALYZE, WAL, FORMAT JSON) "+claim, "job", "loser", 60.0).Scan(&plan); err != nil {
		return losingCost{}, err
	}
	top, _ := plan[0]["Plan"].(map[string]any)
	if rows, _ := top["Actual Rows"].(float64); rows != 0 {
		return losingCost{}, fmt.Errorf("the losing claim took %v rows", rows)
	}
	wal, _ := top["WAL Bytes"].(float64)
	var c losingCost
	c.WALBytes = int64(wal)
	err = tx.QueryRow(ctx, "SELECT pg_current_xact_id_if_assigned() IS NOT NULL").Scan(&c.XID)
	return c, err
}

// settledWALSyncs is walSyncs once the backends of pools have reported the
// work done so far. A backend reports its statistics when it goes idle, at
// most once a second and later when the statistics are busy, so the
// counters lag the work; pg_stat_force_next_flush (PostgreSQL 15) makes
// each idle connection report at once.
func settledWALSyncs(ctx context.Context, stats *pgx.Conn, pools ...*pgxpool.Pool) int64 {
	for _, pool := range pools {
		for _, c := range pool.AcquireAllIdle(ctx) {
			_, _ = c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
			c.Release()
		}
	}
	time.Sleep(50 * time.Millisecond)
	return walSyncs(ctx, stats)
}

// walSyncs is the server's WAL flushes so far (pg_stat_wal; pg_stat_io
// from PostgreSQL 18), or 0 when neither can be read.
func walSyncs(ctx context.Context, conn *pgx.Conn) int64 {
	var n int64
	if err := conn.QueryRow(ctx, "SELECT wal_sync FROM pg_stat_wal").Scan(&n); err == nil {
		return n
	}
	_ = conn.QueryRow(ctx, "SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'").Scan(&n)
	return n
}

// walBytes is the server's WAL position in bytes (where the next record
// goes), or 0 when it cannot be read.
func walBytes(ctx context.Context, conn *pgx.Conn) int64 {
	var n int64
	_ = conn.QueryRow(ctx, "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')::bigint").Scan(&n)
	return n
}

// nextXID is the server's next transaction id, read without taking one.
func nextXID(ctx context.Context, conn *pgx.Conn) int64 {
	var n int64
	_ = conn.QueryRow(ctx, "SELECT txid_snapshot_xmax(txid_current_snapshot())").Scan(&n)
	return n
}

// commonMarkdown is the table of the common-path study, with each case's
// ratios against today's statements sent raw and against the statements
// before the hardening.
func commonMarkdown(points []commonPoint, losing []losingCost, slice time.Duration, rounds int) string {
	if len(points) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### The common path: each variant in turns of %v, %d turns each (runs/s: the median turn)\n\n", slice, rounds)
	b.WriteString("| case | variant | job runs/s | vs raw | vs before | client CPU per run | allocations per run | statements per run | server CPU per run | WAL flushes per run | transaction ids per run |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	by := map[string]map[string]commonPoint{}
	for _, p := range points {
		if by[p.Case] == nil {
			by[p.Case] = map[string]commonPoint{}
		}
		by[p.Case][p.Variant] = p
	}
	for _, p := range points {
		cpu := "n/a"
		if p.CPU >= 0 {
			cpu = fmt.Sprintf("%.0f µs", p.CPU)
		}
		fmt.Fprintf(&b, "| %s | %s | %.0f | %s | %s | %.0f µs | %.0f | %.2f | %s | %.2f | %.2f |\n", p.Case, p.Variant, p.Runs,
			ratio(p.Runs, by[p.Case][rawNow].Runs), ratio(p.Runs, by[p.Case][rawF1d3080].Runs),
			p.ClientCPU, p.Allocs, p.Statements, cpu, p.WALSyncs, p.XIDs)
	}
	if len(losing) > 0 {
		b.WriteString("\n| a losing claim (another holder's live lease) | transaction id | WAL bytes |\n|---|---|---|\n")
		for _, c := range losing {
			fmt.Fprintf(&b, "| %s | %v | %d |\n", c.Variant, c.XID, c.WALBytes)
		}
	}
	return b.String()
}

func ratio(x, y float64) string {
	if y <= 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2fx", x/y)
}

// writeCommonCSV writes the common-path study's points.
func writeCommonCSV(path string, points []commonPoint) error {
	rows := [][]string{{"case", "variant", "workers", "runs_per_s", "client_cpu_us_per_run", "allocs_per_run", "statements_per_run",
		"server_cpu_us_per_run", "wal_syncs_per_run", "xids_per_run"}}
	for _, p := range points {
		rows = append(rows, []string{p.Case, p.Variant, itoa(p.Workers), fmt.Sprintf("%.1f", p.Runs),
			fmt.Sprintf("%.1f", p.ClientCPU), fmt.Sprintf("%.1f", p.Allocs), fmt.Sprintf("%.3f", p.Statements),
			fmt.Sprintf("%.1f", p.CPU), fmt.Sprintf("%.3f", p.WALSyncs), fmt.Sprintf("%.3f", p.XIDs)})
	}
	return lab.WriteCSV(path, rows)
}
