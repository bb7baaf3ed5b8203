package main

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/bench/internal/lab"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// Tick styles compared by the fleet study.
const (
	tickCoalesced = "coalesced (pglease)"
	tickPerClaim  = "one statement per claim"
	// tickTicks is Lock through a job of ticks (WithPeriod): the claim of
	// a tick, which also writes the ledger of runs. Only its WAL is
	// measured, against tickCoalesced's (the ledger's cost per tick).
	tickTicks = "ticks (WithPeriod, with the ledger)"
)

// fleetPeriod is the period of the fleet's jobs of ticks: every claim of
// a tick of the study lands within half of it.
const fleetPeriod = 4 * time.Second

// fleetConns is the pool size of each replica.
const fleetConns = 8

// tickPoint is what one style cost per tick for one number of jobs: the
// median time until every job of the fleet had its outcome, the Lock
// latencies of every call of every tick, and per tick the claim statements
// and the server's CPU time.
type tickPoint struct {
	Style      string
	Replicas   int
	Jobs       int
	Ticks      int
	Tick       time.Duration // median
	P50, P99   time.Duration // of every Lock call
	Statements float64       // claim statements per tick
	CPU        float64       // server CPU seconds per tick; negative when unknown
	XIDs       float64       // transaction ids per tick, its releases included
	WALSyncs   float64       // WAL flushes of one tick, its releases included
	WALBytes   float64       // WAL bytes of one tick, its releases included
	// Of tickCoalesced's point only: one tick of the same jobs as jobs of
	// ticks (tickTicks), whose claims also write the ledger of runs.
	TicksWALBytes, TicksWALSyncs float64
}

// counter counts the claim statements its pools send.
type counter struct{ claims atomic.Int64 }

func (c *counter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if strings.HasPrefix(data.SQL, "INSERT INTO") {
		c.claims.Add(1)
	}
	return ctx
}

func (c *counter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// replica is one member of the fleet: its own pool, and its Locker.
type replica struct {
	holder string
	pool   *pgxpool.Pool
	locker *pglease.Locker
	job    *pglease.JobLocker // the same Locker's jobs of ticks (fleetPeriod)
}

// studyFleet runs ticks of a fleet of replicas, each with its own pool and
// Locker, where every replica calls Lock for each of jobs keys at the same
// instant, as gocron does on every replica when the jobs are due together.
// Exactly one replica wins each key. The per-claim style sends pglease's
// claim statement once per Lock, on the same pools: what each Lock cost
// before claims were coalesced (the baseline has no Locker overhead, so it
// flatters the old path). Winners are released between ticks, untimed.
// Ticks of the two styles alternate.
func studyFleet(ctx context.Context, stats *pgx.Conn, dsn string, postmaster, replicas int, jobs []int, ticks int) ([]tickPoint, error) {
	var out []tickPoint
	serverCPU := func() float64 { return lab.ServerCPU(postmaster) }
	for _, j := range jobs {
		table := fmt.Sprintf("fleet_%d", j)
		cnt := &counter{}
		fleet, err := newFleet(ctx, dsn, table, replicas, cnt)
		if err != nil {
			return nil, err
		}
		keys := make([]string, j)
		for i := range keys {
			keys[i] = fmt.Sprintf("job-%04d", i)
		}
		styles := []string{tickCoalesced, tickPerClaim}
		type acc struct {
			ticks     []time.Duration
			latencies []time.Duration
			stmts     int64
			cpu       float64
			xids      int64
			syncs     int64
		}
		got := map[string]*acc{}
		for _, style := range styles {
			got[style] = &acc{}
			if _, _, err := tick(ctx, fleet, table, keys, style); err != nil { // warm up: prepares the statements
				closeFleet(fleet)
				return nil, err
			}
		}
		for range ticks {
			for _, style := range styles {
				a := got[style]
				before, cpuBefore := cnt.claims.Load(), serverCPU()
				xids := nextXID(ctx, stats)
				took, lat, err := tick(ctx, fleet, table, keys, style)
				if err != nil {
					closeFleet(fleet)
					return nil, err
				}
				a.stmts += cnt.claims.Load() - before
				a.cpu += serverCPU() - cpuBefore
				a.xids += nextXID(ctx, stats) - xids
				a.ticks = append(a.ticks, took)
				a.latencies = append(a.latencies, lat...)
			}
		}
		// One more tick of each style alone, to read its WAL flushes once
		// every backend has reported them (settledWALSyncs), and its WAL
		// bytes; then two ticks of the jobs as jobs of ticks, each at the
		// start of a tick of fleetPeriod, the second measured (its claims
		// also close the runs of the first in the ledger).
		pools := make([]*pgxpool.Pool, len(fleet))
		for i, r := range fleet {
			pools[i] = r.pool
		}
		measure := func(style string) (syncs, bytes int64, err error) {
			if style == tickTicks {
				time.Sleep(time.Until(time.Now().Truncate(fleetPeriod).Add(fleetPeriod + fleetPeriod/20)))
			}
			syncs0, bytes0 := settledWALSyncs(ctx, stats, pools...), walBytes(ctx, stats)
			if _, _, err := tick(ctx, fleet, table, keys, style); err != nil {
				return 0, 0, err
			}
			syncs = settledWALSyncs(ctx, stats, pools...) - syncs0
			return syncs, walBytes(ctx, stats) - bytes0, nil
		}
		walOf := map[string]int64{}
		for _, style := range []string{tickCoalesced, tickPerClaim, tickTicks, tickTicks} {
			syncs, bytes, err := measure(style)
			if err != nil {
				closeFleet(fleet)
				return nil, err
			}
			if a := got[style]; a != nil {
				a.syncs = syncs
			} else {
				got[style] = &acc{syncs: syncs} // the second tick of tickTicks is kept
			}
			walOf[style] = bytes
		}
		closeFleet(fleet)
		for _, style := range styles {
			a := got[style]
			slices.Sort(a.ticks)
			slices.Sort(a.latencies)
			cpu := a.cpu / float64(ticks)
			if serverCPU() < 0 {
				cpu = -1
			}
			out = append(out, tickPoint{
				Style: style, Replicas: replicas, Jobs: j, Ticks: ticks,
				Tick: a.ticks[len(a.ticks)/2],
				P50:  a.latencies[len(a.latencies)/2], P99: a.latencies[len(a.latencies)*99/100],
				Statements: float64(a.stmts) / float64(ticks), CPU: cpu,
				XIDs: float64(a.xids) / float64(ticks), WALSyncs: float64(a.syncs), WALBytes: float64(walOf[style]),
			})
			if style == tickCoalesced {
				out[len(out)-1].TicksWALBytes = float64(walOf[tickTicks])
				out[len(out)-1].TicksWALSyncs = float64(got[tickTicks].syncs)
			}
		}
	}
	return out, nil
}

func newFleet(ctx context.Context, dsn, table string, n int, cnt *counter) ([]replica, error) {
	var fleet []replica
	for r := range n {
		cfg, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return nil, err
		}
		cfg.MaxConns = fleetConns
		cfg.ConnConfig.Tracer = cnt
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			closeFleet(fleet)
			return nil, err
		}
		if r == 0 {
			if err := pglease.Migrate(ctx, pool, pglease.WithTable(table)); err != nil {
				pool.Close()
				return nil, err
			}
		}
		holder := fmt.Sprintf("replica-%d", r)
		l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithTTL(time.Minute), pglease.WithLogger(quiet))
		job, err := l.Job(pglease.WithPeriod(fleetPeriod))
		if err != nil {
			_ = l.Close(ctx)
			pool.Close()
			closeFleet(fleet)
			return nil, err
		}
		fleet = append(fleet, replica{holder: holder, pool: pool, locker: l, job: job})
	}
	return fleet, nil
}

func closeFleet(fleet []replica) {
	for _, r := range fleet {
		_ = r.locker.Close(context.Background())
		r.pool.Close()
	}
}

// won is a claim that won, to be released after the tick.
type won struct {
	r     *replica
	key   string
	fence int64
	lease *pglease.Lease
}

// tick makes every replica claim every key at once in style, and returns
// how long until every claim had its outcome and the latency of each. It
// then releases what was won, untimed, and checks that each key had
// exactly one winner.
func tick(ctx context.Context, fleet []replica, table string, keys []string, style string) (time.Duration, []time.Duration, error) {
	claim := render(sqlstmt.Claim, table)
	n := len(fleet) * len(keys)
	lat := make([]time.Duration, n)
	errs := make([]error, n)
	wins := make([]*won, n)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for ri := range fleet {
		r := &fleet[ri]
		for ki, key := range keys {
			i := ri*len(keys) + ki
			wg.Go(func() {
				<-start
				t0 := time.Now()
				defer func() { lat[i] = time.Since(t0) }()
				if style == tickCoalesced || style == tickTicks {
					var locker gocron.Locker = r.locker
					if style == tickTicks {
						locker = r.job
					}
					lock, err := locker.Lock(ctx, key)
					switch {
					case err == nil:
						wins[i] = &won{r: r, key: key, lease: lock.(*pglease.Lease)}
					case !errors.Is(err, pglease.ErrHeld):
						errs[i] = err
					}
					return
				}
				var (
					fence    int64
					acq, exp time.Time
					live     bool
					table    uint32
				)
				err := r.pool.QueryRow(ctx, claim, key, r.holder, time.Minute.Seconds()).Scan(&fence, &acq, &exp, &live, &table, nil)
				switch {
				case err == nil:
					wins[i] = &won{r: r, key: key, fence: fence}
				case !errors.Is(err, pgx.ErrNoRows):
					errs[i] = err
				}
			})
		}
	}
	began := time.Now()
	close(start)
	wg.Wait()
	took := time.Since(began)
	if err := errors.Join(errs...); err != nil {
		return 0, nil, err
	}

	winners := map[string]int{}
	release := render(sqlstmt.Release, table)
	var rel sync.WaitGroup
	relErrs := make([]error, n)
	for i, w := range wins {
		if w == nil {
			continue
		}
		winners[w.key]++
		rel.Go(func() {
			if w.lease != nil {
				relErrs[i] = w.lease.Unlock(ctx)
				return
			}
			// Sent again while its commit waits past the lock wait for the
			// notification queue's lock, as a Locker does (releaseLocked).
			relErrs[i] = releaseLocked(ctx, func() (bool, error) {
				_, err := w.r.pool.Exec(ctx, release, w.r.holder, []float64{0}, []string{w.key}, []int64{w.fence}, "20ms")
				var pgErr *pgconn.PgError
				if errors.As(err, &pgErr) && pgErr.Code == "55P03" {
					return false, nil
				}
				return err == nil, err
			})
		})
	}
	rel.Wait()
	if err := errors.Join(relErrs...); err != nil {
		return 0, nil, err
	}
	for _, key := range keys {
		if winners[key] != 1 {
			return 0, nil, fmt.Errorf("%s: key %s had %d winners in one tick, not 1", style, key, winners[key])
		}
	}
	return took, lat, nil
}
