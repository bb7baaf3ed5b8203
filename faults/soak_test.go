package faults_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
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

// TestSoak checks that no two mandates of a key overlap, fences grow and
// no key starves under chaos. It runs 5 replicas (gocron schedulers with
// the Locker) on 50 jobs each, through fault proxies, while replicas crash and restart and their proxies die,
// blackhole or reset, never more than two replicas at a time. Every job run
// records its mandate; afterwards the mandates are checked offline.
func TestSoak(t *testing.T) {
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
	rnd := newSoakRand(seed)

	direct := pgtest.Pool(t, nil)
	table := pgtest.Table(t, direct)
	var (
		runs     soakRuns
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
		r.pool = pgtest.AppPool(t, "", slot.proxy, r.name)
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
			// Some runs outlast the TTL: heartbeats keep them, faults lose them.
			runs.addJob(t, sched, r.locker, r.name, key, period, at, func() time.Duration { return rnd.dur(50*time.Millisecond, 2*ttl) })
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
		slots[i] = &soakSlot{proxy: pgtest.Proxy(t, "")}
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
			i := rnd.intn(replicas)
			s := slots[i]
			if s.restore == nil {
				d := rnd.dur(ttl/10, 2*ttl)
				s.downTill = now.Add(d)
				outages = append(outages, down{now, s.downTill})
				kind := rnd.intn(4)
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
		time.Sleep(rnd.dur(100*time.Millisecond, 700*time.Millisecond)) // the pace of the chaos, not a wait for a result
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

	all := runs.all()
	// No key waits for a mandate longer than a lost holder's row may stay
	// live (a TTL past its last heartbeat, which its holder stopped
	// trusting up to a TTL before), then the next run's tick (a period),
	// and 2 s for a busy machine's timers, the claims' timeout and the
	// pools' reconnections through the proxies. Safety (overlaps, fences)
	// has no such slack.
	st := checkLeases(all, began.Add(2*ttl), ended, 2*ttl+period+2*time.Second)
	require.Equal(t, keys, st.keys, "every key ran")
	for _, p := range st.problems {
		t.Error(p)
	}
	resets, dropped := 0, int64(0)
	for _, s := range slots {
		resets += s.proxy.Stats().Resets
		dropped += s.proxy.Stats().DroppedBytes
	}
	t.Logf("figures: soak %v, %d replicas x %d jobs, TTL %v, period %v: faults %v (%d outages, at most %d replicas down at once); %d claims, %d mandates checked, %d takeovers, %d lost leases detected (%d job contexts ended by ErrLost), %d connections reset, %d bytes dropped; overlaps %d, fence inversions %d, longest time a key had no mandate %v (bound %v)",
		ended.Sub(began).Round(time.Second), replicas, keys, ttl, period, faults, len(outages), maxDown, claims.Load(), len(all), st.takeovers,
		lostSeen.Load(), st.lostRuns, resets, dropped, st.overlaps, st.inversions, st.worstGap.Round(time.Millisecond), 2*ttl+period)
}
