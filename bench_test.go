package pglease_test

// Benchmarks of pglease against a baseline that sends the same SQL raw
// through the same pgx pool. Every comparison runs side by side in one run,
// and is read as a ratio (see docs/BENCHMARKS.md): absolute times depend on
// the machine. Unless a benchmark starts a private durable server, it uses
// the package's shared test server, which runs with fsync off.

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// The baselines send the very statements a Locker sends (internal/sqlstmt):
// an Unlock alone is sqlstmt.ReleaseOne.
const (
	benchClaimSQL     = sqlstmt.Claim
	benchReleaseSQL   = sqlstmt.ReleaseOne
	benchHeartbeatSQL = sqlstmt.Heartbeat
)

// naiveReleaseSQL is the release without its set_config clause: it commits
// synchronously, waiting for the WAL flush like any other statement. It is
// the baseline of BenchmarkReleaseCommit.
var naiveReleaseSQL = withoutAsyncCommit(sqlstmt.ReleaseOne)

// withoutAsyncCommit is release without the clause that makes it commit
// without waiting for the WAL flush.
func withoutAsyncCommit(release string) string {
	async := regexp.MustCompile(`\n\s+AND set_config\('synchronous_commit', 'off', true\) IS NOT NULL`)
	naive := async.ReplaceAllLiteralString(release, "")
	if naive == release {
		panic("the release statement has no asynchronous commit clause to take out")
	}
	return naive
}

// renderSQL fills a statement template for table the way a Locker does, so
// that the raw baseline sends byte for byte the same text.
func renderSQL(tmpl, table string) string { return sqlstmt.Render(tmpl, pgx.Identifier{table}) }

// each is the array of n equal durations in seconds that the heartbeat and
// release statements take, one per lease, when every lease has the same.
func each(n int, seconds float64) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = seconds
	}
	return out
}

// benchTTL is the TTL of every benchmark lease: long enough that no lease
// lapses and no heartbeat fires during a claim/release benchmark.
const benchTTL = time.Minute

// stmtTracer counts statements (one Query or Exec each: one round trip once
// the statement is prepared on its connection) by kind, at start and at end.
type stmtTracer struct {
	started atomic.Int64
	mu      sync.Mutex
	ended   map[string]int64
}

type stmtKindKey struct{}

func (s *stmtTracer) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.started.Add(1)
	return context.WithValue(ctx, stmtKindKey{}, pgtest.StatementKind(data.SQL))
}

func (s *stmtTracer) TraceQueryEnd(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryEndData) {
	kind, _ := ctx.Value(stmtKindKey{}).(string)
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ended == nil {
		s.ended = make(map[string]int64)
	}
	s.ended[kind]++
}

func (s *stmtTracer) endedOf(kind string) int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ended[kind]
}

// benchPool connects to dsn with room for conns connections and tracer.
func benchPool(tb testing.TB, dsn string, conns int32, tracer pgx.QueryTracer) *pgxpool.Pool {
	tb.Helper()
	return pgtest.PoolWith(tb, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = conns
		if tracer != nil {
			cfg.ConnConfig.Tracer = tracer
		}
	})
}

// benchTable migrates a fresh lease table named after the benchmark.
func benchTable(tb testing.TB, db pglease.DB, name string) string {
	tb.Helper()
	table := pgtest.Name("bench_" + name)
	require.NoError(tb, pglease.Migrate(context.Background(), db, pglease.WithTable(table)))
	return table
}

func benchLocker(tb testing.TB, db pglease.DB, table, holder string, opts ...pglease.Option) *pglease.Locker {
	tb.Helper()
	all := append([]pglease.Option{
		pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithTTL(benchTTL), pglease.WithLogger(pgtest.Quiet),
	}, opts...)
	l := pglease.NewLocker(db, all...)
	tb.Cleanup(func() { _ = l.Close(context.Background()) })
	return l
}

// durableServer starts a private server that flushes its WAL as a
// production server does (the shared one runs with fsync off), stopped at
// cleanup.
func durableServer(b *testing.B) *pgserver.Server {
	b.Helper()
	srv, err := pgserver.Start(context.Background(), pgserver.Options{Durable: true, Private: true})
	require.NoError(b, err)
	b.Cleanup(func() { _ = srv.Close() })
	return srv
}

// statsConn connects to srv outside any pool measured, to read its
// statistics (walSyncs); it is closed at cleanup.
func statsConn(b *testing.B, srv *pgserver.Server) *pgx.Conn {
	b.Helper()
	conn, err := pgx.Connect(context.Background(), srv.DSN())
	require.NoError(b, err)
	b.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// cycle is one claim/release attempt on key. It reports whether the claim
// won (false: another holder's lease was live).
type cycle func(ctx context.Context, key string) (bool, error)

// lockerCycle is a full job run through pglease: Claim, then Unlock.
func lockerCycle(l *pglease.Locker) cycle {
	return func(ctx context.Context, key string) (bool, error) {
		lease, err := l.Claim(ctx, key)
		if errors.Is(err, pglease.ErrHeld) {
			return false, nil
		}
		if err != nil {
			return false, err
		}
		return true, lease.Unlock(ctx)
	}
}

// rawCycle sends the claim and release statements straight to db, as
// pglease renders them, with release as the release statement.
func rawCycle(db pglease.DB, table, holder, release string) cycle {
	claim := renderSQL(benchClaimSQL, table)
	one := strings.HasPrefix(release, "UPDATE") // sqlstmt.ReleaseOne's arguments, not Release's
	release = renderSQL(release, table)
	ttl := benchTTL.Seconds()
	return func(ctx context.Context, key string) (bool, error) {
		fence, won, err := claimRaw(ctx, db, claim, key, holder, ttl, true)
		if !won || err != nil {
			return false, err
		}
		args := []any{holder, each(1, 0), []string{key}, []int64{fence}}
		if one {
			args = []any{holder, key, fence, 0.0, "20ms"}
		}
		// Sent again after a 55P03, as a Locker does: on a contended key the
		// claims in flight, or the notification lock at commit, can hold
		// the release past its 20ms wait.
		tag, err := db.Exec(ctx, release, args...)
		for wait := time.Millisecond; lockedPastTheWait(err); wait = min(2*wait, 250*time.Millisecond) {
			select {
			case <-ctx.Done():
				return true, ctx.Err()
			case <-time.After(wait):
			}
			tag, err = db.Exec(ctx, release, args...)
		}
		if err != nil {
			return true, err
		}
		if tag.RowsAffected() != 1 {
			return true, fmt.Errorf("release of %q fence %d touched %d rows", key, fence, tag.RowsAffected())
		}
		return true, nil
	}
}

// lockedPastTheWait reports whether err is a statement's lock_timeout
// (55P03): nothing was written, and it may be sent again.
func lockedPastTheWait(err error) bool {
	var pgErr *pgconn.PgError
	return errors.As(err, &pgErr) && pgErr.Code == "55P03"
}

// roundCycle is one heartbeat round sent raw: sql (a heartbeat statement
// template) with holder, ttl and the leases keys/fences. It fails unless
// the round extended every lease.
func roundCycle(db pglease.DB, sql, table, holder string, ttl any, keys []string, fences []int64) cycle {
	sql = renderSQL(sql, table)
	return func(ctx context.Context, _ string) (bool, error) {
		rows, err := db.Query(ctx, sql, holder, ttl, keys, fences)
		if err != nil {
			return false, err
		}
		extended := 0
		for rows.Next() {
			extended++
		}
		if err := rows.Err(); err != nil {
			return false, err
		}
		if extended != len(keys) {
			return false, fmt.Errorf("a round extended %d of %d leases", extended, len(keys))
		}
		return true, nil
	}
}

// claimRaw sends claim, a rendered claim statement, for key: won is false
// when another holder's lease is live. withOID: the statement returns the
// row's tableoid too, as every claim since partitioned tables does.
func claimRaw(ctx context.Context, db pglease.DB, claim, key, holder string, ttl float64, withOID bool) (fence int64, won bool, err error) {
	var (
		acq, exp time.Time
		live     bool
	)
	dest := []any{&fence, &acq, &exp, &live}
	if withOID {
		dest = append(dest, new(uint32), new(string))
	}
	err = db.QueryRow(ctx, claim, key, holder, ttl).Scan(dest...)
	if errors.Is(err, pgx.ErrNoRows) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	if !live {
		return 0, false, fmt.Errorf("claim of %q returned an expired row", key)
	}
	return fence, true, nil
}

// runCycles runs b.N cycles spread over len(cycles) goroutines; goroutine g
// runs cycles[g] on keys[g]. It reports stmts/op from tracer, and won/op
// (the share of attempts whose claim won). ready, if not nil, runs once the
// statements are prepared, just before the timed cycles.
func runCycles(b *testing.B, tracer *stmtTracer, cycles []cycle, keys []string, ready func()) {
	b.Helper()
	ctx := context.Background()
	for g, c := range cycles { // prepare every statement on the connections
		if _, err := c(ctx, keys[g]); err != nil {
			b.Fatal(err)
		}
	}
	if ready != nil {
		ready()
	}
	b.ReportAllocs()
	b.ResetTimer()
	before := tracer.started.Load()
	var (
		next, won atomic.Int64
		wg        sync.WaitGroup
		failed    = make(chan error, len(cycles))
	)
	for g, c := range cycles {
		wg.Go(func() {
			for next.Add(1) <= int64(b.N) {
				ok, err := c(ctx, keys[g])
				if err != nil {
					failed <- err
					return
				}
				if ok {
					won.Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(failed)
	if err := <-failed; err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(float64(tracer.started.Load()-before)/float64(b.N), "stmts/op")
	b.ReportMetric(float64(won.Load())/float64(b.N), "won/op")
}

// BenchmarkClaimRelease compares a full job run (claim, then release)
// through a Locker with the same two statements sent raw through the same
// pool: on one key from one goroutine; on one key per goroutine, with one
// Locker for all (as one replica running many jobs) and with one Locker
// per goroutine; and with every goroutine contending for one key (each with
// its own holder; an attempt that finds the key held costs only the claim).
func BenchmarkClaimRelease(b *testing.B) {
	const n = 8
	cases := []struct {
		name       string
		goroutines int
		sameKey    bool
		oneHolder  bool // one Locker (holder) for all goroutines
	}{
		{"one-key", 1, true, true},
		{fmt.Sprintf("keys=%d-goroutines=%d", n, n), n, false, true},
		{fmt.Sprintf("keys=%d-goroutines=%d-lockers=%d", n, n, n), n, false, false},
		{fmt.Sprintf("contended-goroutines=%d", n), n, true, false},
	}
	for _, tc := range cases {
		keys := make([]string, tc.goroutines)
		holders := make([]string, tc.goroutines)
		for g := range keys {
			keys[g], holders[g] = "job", "replica"
			if !tc.sameKey {
				keys[g] = fmt.Sprintf("job-%d", g)
			}
			if !tc.oneHolder {
				holders[g] = fmt.Sprintf("replica-%d", g)
			}
		}
		b.Run(tc.name+"/pglease", func(b *testing.B) {
			tracer := &stmtTracer{}
			pool := benchPool(b, pgtest.Server.DSN(), int32(tc.goroutines)+2, tracer)
			table := benchTable(b, pool, "claim")
			cycles := make([]cycle, tc.goroutines)
			lockers := map[string]*pglease.Locker{}
			for g, h := range holders {
				if lockers[h] == nil {
					lockers[h] = benchLocker(b, pool, table, h)
				}
				cycles[g] = lockerCycle(lockers[h])
			}
			runCycles(b, tracer, cycles, keys, nil)
		})
		b.Run(tc.name+"/raw", func(b *testing.B) {
			tracer := &stmtTracer{}
			pool := benchPool(b, pgtest.Server.DSN(), int32(tc.goroutines)+2, tracer)
			table := benchTable(b, pool, "claim")
			cycles := make([]cycle, tc.goroutines)
			for g, h := range holders {
				cycles[g] = rawCycle(pool, table, h, benchReleaseSQL)
			}
			runCycles(b, tracer, cycles, keys, nil)
		})
		// Both, alternating cycle by cycle on the same table and keys, so
		// that a noisy machine slows both alike: the ratio to read.
		b.Run(tc.name+"/interleaved", func(b *testing.B) {
			pool := benchPool(b, pgtest.Server.DSN(), int32(tc.goroutines)+2, nil)
			table := benchTable(b, pool, "claim")
			locker, raw := make([]cycle, tc.goroutines), make([]cycle, tc.goroutines)
			lockers := map[string]*pglease.Locker{}
			for g, h := range holders {
				if lockers[h] == nil {
					lockers[h] = benchLocker(b, pool, table, "pglease-"+h)
				}
				locker[g] = lockerCycle(lockers[h])
				raw[g] = rawCycle(pool, table, "raw-"+h, benchReleaseSQL)
			}
			runInterleaved(b, variant{"pglease", locker}, variant{"raw", raw}, keys)
		})
	}
}

// variant is one side of an interleaved benchmark: a cycle per goroutine.
type variant struct {
	name   string
	cycles []cycle
}

// runInterleaved runs b.N cycles over the goroutines, each goroutine
// alternating a cycle of x and a cycle of y on its key, and times every
// cycle. It reports the mean time of a cycle of each (x-ns/cycle,
// y-ns/cycle), their ratio (x/y), and the share of each's attempts whose
// claim won (x-won, y-won). Alternating cycle by cycle exposes both
// variants to the same load, which on a shared machine changes by the
// second: their ratio is what these benchmarks are read for.
func runInterleaved(b *testing.B, x, y variant, keys []string) {
	b.Helper()
	ctx := context.Background()
	both := [2]variant{x, y}
	for _, v := range both {
		for g, c := range v.cycles {
			if _, err := c(ctx, keys[g]); err != nil {
				b.Fatal(err)
			}
		}
	}
	var (
		next       atomic.Int64
		spent, won [2]atomic.Int64
		runs       [2]atomic.Int64
		wg         sync.WaitGroup
		failed     = make(chan error, len(keys))
	)
	b.ResetTimer()
	for g := range keys {
		wg.Go(func() {
			for {
				i := next.Add(1)
				if i > int64(b.N) {
					return
				}
				side := int((i + int64(g)) % 2)
				start := time.Now()
				ok, err := both[side].cycles[g](ctx, keys[g])
				spent[side].Add(int64(time.Since(start)))
				runs[side].Add(1)
				if err != nil {
					failed <- err
					return
				}
				if ok {
					won[side].Add(1)
				}
			}
		})
	}
	wg.Wait()
	b.StopTimer()
	close(failed)
	if err := <-failed; err != nil {
		b.Fatal(err)
	}
	var mean [2]float64
	for side, v := range both {
		n := max(runs[side].Load(), 1)
		mean[side] = float64(spent[side].Load()) / float64(n)
		b.ReportMetric(mean[side], v.name+"-ns/cycle")
		b.ReportMetric(float64(won[side].Load())/float64(n), v.name+"-won")
	}
	if mean[1] > 0 {
		b.ReportMetric(mean[0]/mean[1], x.name+"/"+y.name)
	}
}

// heartbeatSizes are the numbers of leases one Locker holds in
// BenchmarkHeartbeatRound. -short stops at 1,000.
func heartbeatSizes() []int {
	if testing.Short() {
		return []int{1, 10, 100, 1000}
	}
	return []int{1, 10, 100, 1000, 10000}
}

// BenchmarkHeartbeatRound measures one heartbeat round of a Locker holding
// n leases: pglease's batched statement sent raw with the same arrays
// ("batched"), against one UPDATE per lease ("per-lease"); and a real
// Locker's rounds ("locker"), whose ns/op is the mean round trip of its
// heartbeat statement and whose stmts/op counts heartbeat statements per
// round.
func BenchmarkHeartbeatRound(b *testing.B) {
	ctx := context.Background()
	for _, n := range heartbeatSizes() {
		b.Run(fmt.Sprintf("leases=%d", n), func(b *testing.B) {
			tracer := &stmtTracer{}
			pool := benchPool(b, pgtest.Server.DSN(), 8, tracer)
			table := benchTable(b, pool, "heartbeat")
			const holder = "replica"
			keys, fences := seedLeases(b, pool, table, holder, n)
			ttl := benchTTL.Seconds()

			b.Run("batched", func(b *testing.B) {
				sql := renderSQL(benchHeartbeatSQL, table)
				b.ReportAllocs()
				before := tracer.started.Load()
				rounds := 0
				for b.Loop() {
					rows, err := pool.Query(ctx, sql, holder, each(n, ttl), keys, fences)
					if err != nil {
						b.Fatal(err)
					}
					extended := 0
					for rows.Next() {
						extended++
					}
					if err := rows.Err(); err != nil {
						b.Fatal(err)
					}
					if extended != n {
						b.Fatalf("a round extended %d of %d leases", extended, n)
					}
					rounds++
				}
				b.ReportMetric(float64(tracer.started.Load()-before)/float64(rounds), "stmts/op")
			})

			b.Run("per-lease", func(b *testing.B) {
				sql := renderSQL(sqlstmt.BaselinePerLeaseHeartbeat, table)
				b.ReportAllocs()
				before := tracer.started.Load()
				rounds := 0
				for b.Loop() {
					for i := range keys {
						var (
							key   string
							fence int64
							exp   time.Time
						)
						if err := pool.QueryRow(ctx, sql, holder, ttl, keys[i], fences[i]).Scan(&key, &fence, &exp); err != nil {
							b.Fatalf("extending %s: %v", keys[i], err)
						}
					}
					rounds++
				}
				b.ReportMetric(float64(tracer.started.Load()-before)/float64(rounds), "stmts/op")
			})

			b.Run("locker", func(b *testing.B) {
				benchLockerRounds(b, n)
			})
		})
	}
}

// seedLeases creates n live leases of holder in table.
func seedLeases(b *testing.B, db pglease.DB, table, holder string, n int) ([]string, []int64) {
	b.Helper()
	rows, err := db.Query(context.Background(), renderSQL(sqlstmt.SeedLeases, table), holder, n)
	require.NoError(b, err)
	keys, fences := make([]string, 0, n), make([]int64, 0, n)
	for rows.Next() {
		var (
			key   string
			fence int64
		)
		require.NoError(b, rows.Scan(&key, &fence))
		keys, fences = append(keys, key), append(fences, fence)
	}
	require.NoError(b, rows.Err())
	require.Len(b, keys, n)
	return keys, fences
}

// heartbeatRound is what a Locker's hook saw of one heartbeat round.
type heartbeatRound struct {
	seq    int64         // rounds reported so far, this one included
	stmts  int64         // heartbeat statements ended so far
	took   time.Duration // the round's statement
	leases int
	failed bool
}

// benchLockerRounds claims n leases with a real Locker whose heartbeat runs
// back to back, and times its rounds as its hook reports them. The hook runs
// on the heartbeat goroutine between rounds, so the statement count it
// snapshots is exact for the rounds up to its own.
func benchLockerRounds(b *testing.B, n int) {
	b.Helper()
	tracer := &stmtTracer{}
	pool := benchPool(b, pgtest.Server.DSN(), 8, tracer)
	table := benchTable(b, pool, "locker_heartbeat")
	var seq atomic.Int64
	rounds := make(chan heartbeatRound, 4096)
	hook := func(ev pglease.Event) {
		if ev.Kind != pglease.EventExtended && ev.Kind != pglease.EventHeartbeatFailed {
			return
		}
		r := heartbeatRound{seq: seq.Add(1), stmts: tracer.endedOf("heartbeat"), took: ev.Took, leases: ev.Leases,
			failed: ev.Kind == pglease.EventHeartbeatFailed}
		select {
		case rounds <- r:
		default: // the benchmark reads fewer rounds than run; seq keeps count
		}
	}
	l := benchLocker(b, pool, table, "replica", pglease.WithHeartbeatInterval(time.Millisecond), pglease.WithHook(hook))
	claimMany(b, l, n)

	next := func() heartbeatRound {
		for {
			select {
			case r := <-rounds:
				if r.failed {
					b.Fatalf("heartbeat round %d failed", r.seq)
				}
				if r.leases == n {
					return r
				}
				// A round that started while the claims were still coming in.
			case <-time.After(time.Minute):
				b.Fatal("no heartbeat round within a minute")
			}
		}
	}
	first := next()
	for len(rounds) > 0 { // start from a fresh round
		first = next()
	}
	var (
		last  heartbeatRound
		took  time.Duration
		count int
	)
	for b.Loop() {
		last = next()
		took += last.took
		count++
	}
	b.ReportMetric(float64(took.Nanoseconds())/float64(count), "ns/op")
	b.ReportMetric(float64(last.stmts-first.stmts)/float64(last.seq-first.seq), "stmts/op")
	b.ReportMetric(float64(last.leases), "leases/op")
}

// claimMany claims n leases k1..kn with l, from a few goroutines.
func claimMany(b *testing.B, l *pglease.Locker, n int) {
	b.Helper()
	const workers = 4
	var (
		wg     sync.WaitGroup
		failed = make(chan error, workers)
	)
	for w := range workers {
		wg.Go(func() {
			for i := w + 1; i <= n; i += workers {
				if _, err := l.Claim(context.Background(), fmt.Sprintf("k%d", i)); err != nil {
					failed <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(failed)
	if err := <-failed; err != nil {
		b.Fatal(err)
	}
}

// BenchmarkReleaseCommit measures a full Claim + Unlock cycle on a durable
// private server (fsync and synchronous_commit on), where the release
// commits without waiting for the WAL flush ("pglease"), against the same
// cycle sent raw with that release ("raw-async") and with the naive
// synchronous release ("raw-sync"). walsyncs/op counts WAL fsyncs per cycle
// from pg_stat_wal, which shows whether the release's set_config takes
// effect: a synchronous release adds one flush per cycle.
func BenchmarkReleaseCommit(b *testing.B) {
	srv := durableServer(b)
	stats := statsConn(b, srv)

	for _, goroutines := range []int{1, 4} {
		keys := make([]string, goroutines)
		for g := range keys {
			keys[g] = fmt.Sprintf("job-%d", g)
		}
		variants := []struct {
			name    string
			release string // "" for the Locker
		}{
			{"pglease", ""},
			{"raw-async", benchReleaseSQL},
			{"raw-sync", naiveReleaseSQL},
		}
		for _, v := range variants {
			b.Run(fmt.Sprintf("goroutines=%d/%s", goroutines, v.name), func(b *testing.B) {
				tracer := &stmtTracer{}
				pool := benchPool(b, srv.DSN(), int32(goroutines)+2, tracer)
				table := benchTable(b, pool, "commit")
				cycles := make([]cycle, goroutines)
				if v.release == "" {
					l := benchLocker(b, pool, table, "replica")
					for g := range cycles {
						cycles[g] = lockerCycle(l)
					}
				} else {
					for g := range cycles {
						cycles[g] = rawCycle(pool, table, "replica", v.release)
					}
				}
				var syncsBefore int64
				measure := func() {
					flushBackendStats(b, pool)
					syncsBefore = walSyncs(b, stats)
				}
				runCycles(b, tracer, cycles, keys, measure)
				flushBackendStats(b, pool)
				b.ReportMetric(float64(walSyncs(b, stats)-syncsBefore)/float64(b.N), "walsyncs/op")
			})
		}
		// The naive cycle and pglease's, alternating: raw-sync/pglease is
		// how many times faster pglease's cycle is under the same load.
		b.Run(fmt.Sprintf("goroutines=%d/interleaved", goroutines), func(b *testing.B) {
			pool := benchPool(b, srv.DSN(), int32(goroutines)+2, nil)
			table := benchTable(b, pool, "commit")
			l := benchLocker(b, pool, table, "pglease")
			locker, naive := make([]cycle, goroutines), make([]cycle, goroutines)
			for g := range keys {
				locker[g] = lockerCycle(l)
				naive[g] = rawCycle(pool, table, "raw", naiveReleaseSQL)
			}
			runInterleaved(b, variant{"raw-sync", naive}, variant{"pglease", locker}, keys)
		})
	}
}

// flushBackendStats makes every connection of pool publish its pending
// statistics now. Backends publish them at most once a second otherwise;
// pg_stat_force_next_flush (PostgreSQL 15+) makes the next report, which a
// backend sends before it answers ReadyForQuery, unconditional.
func flushBackendStats(b *testing.B, pool *pgxpool.Pool) {
	b.Helper()
	ctx := context.Background()
	for _, c := range pool.AcquireAllIdle(ctx) {
		_, err := c.Exec(ctx, "SELECT pg_stat_force_next_flush()")
		c.Release()
		require.NoError(b, err)
	}
}

// walSyncs is the server's count of WAL fsyncs: pg_stat_wal.wal_sync up to
// PostgreSQL 17, the WAL fsyncs of pg_stat_io from 18 on.
func walSyncs(b *testing.B, conn *pgx.Conn) int64 {
	b.Helper()
	ctx := context.Background()
	var n int64
	err := conn.QueryRow(ctx, "SELECT wal_sync FROM pg_stat_wal").Scan(&n)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42703" { // undefined column
		err = conn.QueryRow(ctx, "SELECT coalesce(sum(fsyncs), 0)::bigint FROM pg_stat_io WHERE object = 'wal'").Scan(&n)
	}
	require.NoError(b, err)
	return n
}
