package pglease_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

var (
	soakFor  = flag.Duration("soak", 25*time.Second, "how long TestChaosSoak runs")
	soakSeed = flag.Int64("soak.seed", 0, "seed of TestChaosSoak's faults (0: from the clock)")
)

// soakMandate is one job run under a lease, recorded from inside the job: from
// the moment it saw its lease until it stopped believing in it (its work
// finished, or its lease context ended).
type soakMandate struct {
	key     string
	fence   int64
	replica string
	start   time.Time
	end     time.Time
	lost    bool      // the lease context ended with ErrLost
	expiry  time.Time // the server's expiry of the lease, as last known to it
}

// soakReplica is one incarnation of one replica slot: a pool through the
// slot's proxy, a pgtest.FaultyDB to crash it, a Locker and a gocron scheduler
// running every job.
type soakReplica struct {
	name   string
	pool   *pgxpool.Pool
	db     *pgtest.FaultyDB
	locker *pglease.Locker
	sched  gocron.Scheduler
}

// soakSlot is one replica position: its proxy outlives its incarnations.
type soakSlot struct {
	proxy    *faultproxy.Proxy
	current  *soakReplica // nil while crashed
	gen      int
	downTill time.Time // unhealthy until then (crashed, proxy down, blackholed)
	restore  func()    // undoes the current fault at downTill
}

// TestChaosSoakNoTwoMandatesOverlapFencesGrowAndNoKeyStarves runs 5
// replicas (gocron schedulers with the Locker) on 50 jobs each, through
// fault proxies, while replicas crash and restart and their proxies die,
// blackhole or reset, never more than two replicas at a time. Every job run
// records its mandate; afterwards the mandates are checked offline.
func TestChaosSoakNoTwoMandatesOverlapFencesGrowAndNoKeyStarves(t *testing.T) {
	t.Parallel()
	const (
		replicas = 5
		keys     = 50
		ttl      = 2 * time.Second
		interval = 500 * time.Millisecond
		period   = time.Second
		maxDown  = 2
	)
	seed := *soakSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("soak seed %d (replay the faults with -soak.seed=%d), duration %v", seed, seed, *soakFor)
	rnd := rand.New(rand.NewSource(seed))
	var rndMu sync.Mutex
	randDur := func(lo, hi time.Duration) time.Duration {
		rndMu.Lock()
		defer rndMu.Unlock()
		return lo + time.Duration(rnd.Int63n(int64(hi-lo)+1))
	}

	direct := pgtest.Pool(t, nil)
	table := pgtest.Table(t, direct)
	var (
		mu       sync.Mutex
		runs     []soakMandate
		lostSeen atomic.Int64
		claims   atomic.Int64
		faults   = map[string]int{}
		wg       sync.WaitGroup // incarnations being torn down
	)
	hook := func(e pglease.Event) {
		switch e.Kind {
		case pglease.EventLost:
			lostSeen.Add(1)
		case pglease.EventAcquired:
			claims.Add(1)
		}
	}
	base := time.Now().Add(500 * time.Millisecond)

	start := func(slot *soakSlot, index int) {
		slot.gen++
		r := &soakReplica{name: fmt.Sprintf("replica-%d.%d", index, slot.gen)}
		r.pool = appPool(t, "", slot.proxy, r.name)
		r.db = pgtest.NewFaultyDB(r.pool)
		r.locker = pglease.NewLocker(r.db, pglease.WithTable(table), pglease.WithHolder(r.name), pglease.WithLogger(pgtest.Quiet),
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithTimeout(time.Second), pglease.WithHook(hook))
		sched, err := gocron.NewScheduler(gocron.WithDistributedLocker(r.locker))
		require.NoError(t, err)
		r.sched = sched
		for k := range keys {
			key := fmt.Sprintf("job-%02d", k)
			// Spread the jobs over the period, on the same grid for every
			// incarnation.
			at := base.Add(time.Duration(k) * period / keys)
			for !at.After(time.Now().Add(50 * time.Millisecond)) {
				at = at.Add(period)
			}
			_, err := sched.NewJob(gocron.DurationJob(period), gocron.NewTask(func(ctx context.Context) {
				lease, ok := r.locker.Held(key)
				if !ok {
					return // lost between the claim and the start: it never believed
				}
				m := soakMandate{key: key, fence: lease.Fence(), replica: r.name, start: time.Now()}
				jctx, cancel := lease.Context(ctx)
				defer cancel()
				// Some runs outlast the TTL: heartbeats keep them, faults lose them.
				work := time.NewTimer(randDur(50*time.Millisecond, 2*ttl))
				defer work.Stop()
				select {
				case <-work.C:
				case <-jctx.Done():
					m.lost = errors.Is(context.Cause(jctx), pglease.ErrLost)
				}
				m.end = time.Now()
				m.expiry = lease.ExpiresAt()
				mu.Lock()
				runs = append(runs, m)
				mu.Unlock()
			}), gocron.WithName(key), gocron.WithSingletonMode(gocron.LimitModeReschedule),
				gocron.WithStartAt(gocron.WithStartDateTime(at)))
			require.NoError(t, err)
		}
		sched.Start()
		slot.current = r
	}
	stop := func(r *soakReplica, crash bool) {
		if crash {
			r.db.Cut(errors.New("replica crashed"))
		}
		wg.Go(func() {
			_ = r.sched.Shutdown()
			_ = r.locker.Close(context.Background())
			r.pool.Close()
		})
	}

	slots := make([]*soakSlot, replicas)
	for i := range slots {
		slots[i] = &soakSlot{proxy: newProxy(t, "")}
		start(slots[i], i)
	}

	began := time.Now()
	deadline := began.Add(*soakFor)
	type down struct{ from, to time.Time }
	var outages []down
	for now := time.Now(); now.Before(deadline); now = time.Now() {
		unhealthy := 0
		for _, s := range slots {
			if s.restore != nil && !now.Before(s.downTill) {
				s.restore()
				s.restore = nil
			}
			if s.restore != nil {
				unhealthy++
			}
		}
		if unhealthy < maxDown {
			i := int(randDur(0, replicas-1))
			s := slots[i]
			if s.restore == nil {
				d := randDur(ttl/10, 2*ttl)
				s.downTill = now.Add(d)
				outages = append(outages, down{now, s.downTill})
				rndMu.Lock()
				kind := rnd.Intn(4)
				rndMu.Unlock()
				t.Logf("fault %s: %d for %v on replica-%d.%d", now.Format("15:04:05.000"), kind, d, i, s.gen)
				switch kind {
				case 0:
					faults["replica crash+restart"]++
					stop(s.current, true)
					s.current = nil
					s.restore = func() { start(s, i) }
				case 1:
					faults["proxy down+up"]++
					s.proxy.Stop()
					s.restore = func() { require.NoError(t, s.proxy.Start()) }
				case 2:
					faults["blackhole"]++
					s.proxy.SetMode(faultproxy.Blackhole)
					s.restore = func() { s.proxy.SetMode(faultproxy.Forward) }
				case 3:
					faults["connection reset"]++
					s.proxy.ResetAll()
					s.downTill = now // nothing to undo
					s.restore = func() {}
				}
			}
		}
		time.Sleep(randDur(100*time.Millisecond, 700*time.Millisecond)) // the pace of the chaos, not a wait for a result
	}
	for _, s := range slots {
		if s.restore != nil {
			s.restore()
		}
	}
	ended := time.Now()
	for _, s := range slots {
		stop(s.current, false)
	}
	wg.Wait()

	mu.Lock()
	all := append([]soakMandate(nil), runs...)
	mu.Unlock()
	st := checkMandates(t, all, keys, began.Add(2*ttl), ended, 2*ttl+period)
	resets, dropped := 0, int64(0)
	for _, s := range slots {
		resets += s.proxy.Stats().Resets
		dropped += s.proxy.Stats().DroppedBytes
	}
	t.Logf("figures: soak %v, %d replicas x %d jobs, TTL %v, period %v: faults %v (%d outages, at most %d replicas down at once); %d claims, %d mandates checked, %d takeovers, %d lost leases detected (%d job contexts ended by ErrLost), %d connections reset, %d bytes dropped; overlaps %d, fence inversions %d, longest time a key had no mandate %v (bound %v)",
		ended.Sub(began).Round(time.Second), replicas, keys, ttl, period, faults, len(outages), maxDown, claims.Load(), len(all), st.takeovers,
		lostSeen.Load(), st.lostRuns, resets, dropped, st.overlaps, st.inversions, st.worstGap.Round(time.Millisecond), 2*ttl+period)
}

type soakStats struct {
	takeovers, lostRuns, overlaps, inversions int
	worstGap                                  time.Duration
}

// checkMandates checks, for every key: no two mandates overlap in time
// (one ends before the next begins), fences strictly increase in the order
// the mandates began, and between from and to the key never goes longer
// than bound without a mandate (no starvation: at least three replicas are
// healthy at any time, so a key waits at most for its last holder's lease
// to expire, one TTL, plus a period for the next tick, well within bound).
func checkMandates(t *testing.T, all []soakMandate, keys int, from, to time.Time, bound time.Duration) soakStats {
	t.Helper()
	byKey := map[string][]soakMandate{}
	var st soakStats
	for _, m := range all {
		byKey[m.key] = append(byKey[m.key], m)
		if m.lost {
			st.lostRuns++
		}
	}
	require.Len(t, byKey, keys, "every key ran")
	for key, ms := range byKey {
		sort.Slice(ms, func(i, j int) bool { return ms[i].start.Before(ms[j].start) })
		for i := 1; i < len(ms); i++ {
			prev, cur := ms[i-1], ms[i]
			if cur.fence <= prev.fence {
				st.inversions++
				t.Errorf("%s: mandate fence %d (%s, from %v) began after fence %d (%s)", key, cur.fence, cur.replica, cur.start, prev.fence, prev.replica)
			}
			if prev.replica != cur.replica {
				st.takeovers++
			}
		}
		// Overlap: any two mandates, not only neighbours.
		for i := range ms {
			for j := i + 1; j < len(ms) && ms[j].start.Before(ms[i].end); j++ {
				st.overlaps++
				t.Errorf("%s: fence %d (%s) believed until %v, %v past its server expiry (lost: %v); fence %d (%s) began at %v: overlap %v",
					key, ms[i].fence, ms[i].replica, ms[i].end.Format("15:04:05.000"), ms[i].end.Sub(ms[i].expiry), ms[i].lost,
					ms[j].fence, ms[j].replica, ms[j].start.Format("15:04:05.000"), ms[i].end.Sub(ms[j].start))
			}
		}
		// Starvation: time in [from, to] during which no mandate of the key
		// was believed.
		covered := from
		for _, m := range ms {
			if m.start.After(to) {
				break
			}
			if gap := m.start.Sub(covered); gap > 0 {
				st.worstGap = max(st.worstGap, gap)
				if gap > bound {
					t.Errorf("%s: no mandate for %v (from %v to %v) while replicas were healthy", key, gap, covered, m.start)
				}
			}
			if m.end.After(covered) {
				covered = m.end
			}
		}
		if gap := to.Sub(covered); gap > bound {
			t.Errorf("%s: no mandate for %v at the end of the run", key, gap)
		}
	}
	return st
}
