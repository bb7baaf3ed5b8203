package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/bench/internal/lab"
)

// environment is what a reader needs to compare these numbers with theirs.
type environment struct {
	CPUs       int
	CPU        string
	Go         string
	PG         string
	Fsync      string
	SyncCommit string
	Autovacuum string
	Naptime    string
}

func describe(ctx context.Context, pool *pgxpool.Pool) (environment, error) {
	env := environment{CPUs: runtime.NumCPU(), CPU: cpuModel(), Go: runtime.Version()}
	err := pool.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('fsync'),
	       current_setting('synchronous_commit'), current_setting('autovacuum'), current_setting('autovacuum_naptime')`).
		Scan(&env.PG, &env.Fsync, &env.SyncCommit, &env.Autovacuum, &env.Naptime)
	return env, err
}

// cpuModel is the first "model name" of /proc/cpuinfo, or "unknown".
func cpuModel() string {
	f, err := os.Open("/proc/cpuinfo")
	if err != nil {
		return "unknown"
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if name, value, ok := strings.Cut(sc.Text(), ":"); ok && strings.TrimSpace(name) == "model name" {
			return strings.TrimSpace(value)
		}
	}
	return "unknown"
}

// writeCSV writes every sample and every heartbeat point, for other plots.
func writeCSV(dir string, runs []storageRun, beats []beatPoint) error {
	rows := [][]string{{"style", "cycle", "elapsed_s", "heap_bytes", "index_bytes", "n_live_tup", "n_dead_tup",
		"n_tup_ins", "n_tup_upd", "n_tup_hot_upd", "n_tup_del", "vacuum_count", "autovacuum_count", "wal_bytes"}}
	for _, r := range runs {
		for _, s := range r.Samples {
			rows = append(rows, []string{r.Style, itoa(s.Cycle), strconv.FormatFloat(s.Elapsed.Seconds(), 'f', 3, 64),
				i64(s.HeapBytes), i64(s.IndexBytes), i64(s.LiveTuples), i64(s.DeadTuples), i64(s.Inserts), i64(s.Updates),
				i64(s.HOTUpdates), i64(s.Deletes), i64(s.Vacuums), i64(s.Autovacuums), i64(s.WALBytes)})
		}
	}
	if err := lab.WriteCSV(filepath.Join(dir, "storage.csv"), rows); err != nil {
		return err
	}
	rows = [][]string{{"style", "leases", "statements", "round_ms", "rounds"}}
	for _, b := range beats {
		rows = append(rows, []string{b.Style, itoa(b.Leases), itoa(b.Statements),
			strconv.FormatFloat(b.Round.Seconds()*1000, 'f', 4, 64), itoa(b.Rounds)})
	}
	return lab.WriteCSV(filepath.Join(dir, "heartbeat.csv"), rows)
}

func itoa(n int) string   { return strconv.Itoa(n) }
func i64(n int64) string  { return strconv.FormatInt(n, 10) }
func kib(n int64) string  { return strconv.FormatFloat(float64(n)/1024, 'f', 0, 64) }
func ms(f float64) string { return strconv.FormatFloat(f, 'f', 3, 64) }

// markdown renders the results as the tables of docs/BENCHMARKS.md.
func markdown(env environment, s settings, runs []storageRun, beats []beatPoint) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Machine: %d CPUs (%s), %s, PostgreSQL %s (fsync=%s, synchronous_commit=%s, autovacuum=%s, autovacuum_naptime=%s).\n\n",
		env.CPUs, env.CPU, env.Go, env.PG, env.Fsync, env.SyncCommit, env.Autovacuum, env.Naptime)

	fmt.Fprintf(&b, "### Storage: %d claim/release cycles over %d keys\n\n", s.cycles, s.keys)
	b.WriteString("| release style | table (final / max) | index (final / max) | dead tuples (final / max) | HOT updates | WAL per cycle | vacuums (manual + auto) | cycles/s |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|\n")
	for _, r := range runs {
		last := r.last()
		hot := "n/a (no updates)"
		if last.Updates > 0 {
			hot = fmt.Sprintf("%.1f%% of %d", 100*r.HOTRatio(), last.Updates)
		}
		fmt.Fprintf(&b, "| %s | %s / %s KiB | %s / %s KiB | %d / %d | %s | %.0f B | %d + %d | %.0f |\n",
			r.Style, kib(last.HeapBytes), kib(r.MaxHeapBytes()), kib(last.IndexBytes), kib(r.MaxIndexBytes()),
			last.DeadTuples, r.MaxDeadTuples(), hot, r.WALPerCycle(), last.Vacuums, last.Autovacuums, r.CyclesPerSecond())
	}

	b.WriteString("\n### Heartbeat: one round over every lease a Locker holds (median)\n\n")
	b.WriteString("| leases | " + strings.Join(beatStyles(beats), " | ") + " | per-lease / batched |\n")
	b.WriteString("|---|" + strings.Repeat("---|", len(beatStyles(beats))+1) + "\n")
	for _, n := range beatSizes(beats) {
		row := []string{itoa(n)}
		var batched, perLease float64
		for _, style := range beatStyles(beats) {
			for _, p := range beats {
				if p.Style == style && p.Leases == n {
					row = append(row, fmt.Sprintf("%s ms (%d stmt)", ms(p.Round.Seconds()*1000), p.Statements))
					switch style {
					case beatBatched:
						batched = p.Round.Seconds()
					case beatPerLease:
						perLease = p.Round.Seconds()
					}
				}
			}
		}
		row = append(row, fmt.Sprintf("%.1fx", perLease/batched))
		b.WriteString("| " + strings.Join(row, " | ") + " |\n")
	}
	return b.String()
}

func beatStyles(beats []beatPoint) []string {
	return distinct(beats, func(p beatPoint) string { return p.Style })
}

func beatSizes(beats []beatPoint) []int {
	return distinct(beats, func(p beatPoint) int { return p.Leases })
}

// distinct is the values of field over points, each once, in the order
// they first appear.
func distinct[P any, V comparable](points []P, field func(P) V) []V {
	var out []V
	for _, p := range points {
		if v := field(p); !slices.Contains(out, v) {
			out = append(out, v)
		}
	}
	return out
}

// fleetMarkdown is the table of the fleet study: per number of jobs, each
// style's tick, Lock latencies, statements and server CPU, and the ratios.
func fleetMarkdown(points []tickPoint) string {
	if len(points) == 0 {
		return ""
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n### Fleet tick: %d replicas (a pool of %d each) x J jobs due at the same instant (median of %d ticks)\n\n",
		points[0].Replicas, fleetConns, points[0].Ticks)
	b.WriteString("| J | style | every job started | Lock p50 | Lock p99 | claim statements | transaction ids | WAL flushes | server CPU | tick ratio | CPU ratio |\n")
	b.WriteString("|---|---|---|---|---|---|---|---|---|---|---|\n")
	base := map[int]tickPoint{}
	for _, p := range points {
		if p.Style == tickCoalesced {
			base[p.Jobs] = p
		}
	}
	for _, p := range points {
		cpu, cpuRatio := "n/a", ""
		if p.CPU >= 0 {
			cpu = fmt.Sprintf("%s ms", ms(p.CPU*1000))
			if c := base[p.Jobs].CPU; c > 0 {
				cpuRatio = fmt.Sprintf("%.1fx", p.CPU/c)
			}
		}
		fmt.Fprintf(&b, "| %d | %s | %s ms | %s ms | %s ms | %.1f | %.1f | %.1f | %s | %.1fx | %s |\n",
			p.Jobs, p.Style, ms(p.Tick.Seconds()*1000), ms(p.P50.Seconds()*1000), ms(p.P99.Seconds()*1000),
			p.Statements, p.XIDs, p.WALSyncs, cpu, p.Tick.Seconds()/base[p.Jobs].Tick.Seconds(), cpuRatio)
	}
	b.WriteString("\n#### The ledger of runs: WAL of one tick, the same jobs as plain keys and as jobs of ticks (WithPeriod)\n\n")
	b.WriteString("Each claim of a tick enters its run in the ledger and closes the run before it, in the claim's own statement; a tick's WAL includes the releases.\n\n")
	b.WriteString("| J | plain keys: WAL bytes | jobs of ticks: WAL bytes | ratio | ledger bytes per job | WAL flushes, plain / ticks |\n")
	b.WriteString("|---|---|---|---|---|---|\n")
	for _, p := range points {
		if p.Style != tickCoalesced || p.WALBytes <= 0 {
			continue
		}
		fmt.Fprintf(&b, "| %d | %.0f | %.0f | %.2fx | %.0f | %.0f / %.0f |\n", p.Jobs, p.WALBytes, p.TicksWALBytes,
			p.TicksWALBytes/p.WALBytes, (p.TicksWALBytes-p.WALBytes)/float64(p.Jobs), p.WALSyncs, p.TicksWALSyncs)
	}
	return b.String()
}

// writeFleetCSV writes the fleet study's points.
func writeFleetCSV(dir string, points []tickPoint) error {
	rows := [][]string{{"style", "replicas", "jobs", "ticks", "tick_ms", "lock_p50_ms", "lock_p99_ms", "claim_statements", "server_cpu_ms"}}
	for _, p := range points {
		rows = append(rows, []string{p.Style, itoa(p.Replicas), itoa(p.Jobs), itoa(p.Ticks),
			ms(p.Tick.Seconds() * 1000), ms(p.P50.Seconds() * 1000), ms(p.P99.Seconds() * 1000),
			strconv.FormatFloat(p.Statements, 'f', 1, 64), ms(p.CPU * 1000)})
	}
	return lab.WriteCSV(filepath.Join(dir, "fleet.csv"), rows)
}
