package faults_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// soakRun is one job run under a lease, recorded from inside the job: from
// the moment it saw its lease until it stopped believing in it (its work
// finished, or its lease context ended).
type soakRun struct {
	key     string
	fence   int64
	replica string
	start   time.Time
	end     time.Time
	lost    bool      // the lease context ended with ErrLost
	expiry  time.Time // the server's expiry of the lease, as last known to it
}

// soakRand is a seeded source shared by the goroutines of a soak, so that
// a seed replays the same draws.
type soakRand struct {
	mu  sync.Mutex
	rnd *rand.Rand
}

func newSoakRand(seed int64) *soakRand { return &soakRand{rnd: rand.New(rand.NewSource(seed))} }

// dur draws a duration in [lo, hi].
func (r *soakRand) dur(lo, hi time.Duration) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	return lo + time.Duration(r.rnd.Int63n(int64(hi-lo)+1))
}

// intn draws an int in [0, n).
func (r *soakRand) intn(n int) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.rnd.Intn(n)
}

// soakRuns records the mandates of the jobs of a soak, from inside the jobs.
type soakRuns struct {
	mu   sync.Mutex
	runs []soakRun
}

// addJob adds to sched the job of key, run every period from at under
// locker l of replica: a run works for work() or until its lease context
// ends, and records its mandate. A run that no longer holds its lease when
// it starts (lost between the claim and the start) never believed, and
// records nothing.
func (s *soakRuns) addJob(t *testing.T, sched gocron.Scheduler, l *pglease.Locker, replica, key string,
	period time.Duration, at time.Time, work func() time.Duration,
) {
	t.Helper()
	// On the same grid, but never in the past, which gocron refuses (a
	// busy machine may take longer to start the replicas than planned).
	for !at.After(time.Now().Add(50 * time.Millisecond)) {
		at = at.Add(period)
	}
	_, err := sched.NewJob(gocron.DurationJob(period), gocron.NewTask(func(ctx context.Context) {
		lease, ok := l.Held(key)
		if !ok {
			return
		}
		m := soakRun{key: key, fence: lease.Fence(), replica: replica, start: time.Now()}
		jctx, cancel := lease.Context(ctx)
		defer cancel()
		timer := time.NewTimer(work())
		defer timer.Stop()
		select {
		case <-timer.C:
		case <-jctx.Done():
			m.lost = errors.Is(context.Cause(jctx), pglease.ErrLost)
		}
		m.end = time.Now()
		m.expiry = lease.ExpiresAt()
		s.mu.Lock()
		s.runs = append(s.runs, m)
		s.mu.Unlock()
	}), gocron.WithName(key), gocron.WithSingletonMode(gocron.LimitModeReschedule),
		gocron.WithStartAt(gocron.WithStartDateTime(at)))
	require.NoError(t, err)
}

// all returns the mandates recorded so far.
func (s *soakRuns) all() []soakRun {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]soakRun(nil), s.runs...)
}

// leaseCheck is what checkLeases found.
type leaseCheck struct {
	keys                                      int // keys with at least one mandate
	takeovers, lostRuns, overlaps, inversions int
	worstGap                                  time.Duration
	problems                                  []string // one line for each inversion, overlap and gap above the bound
}

// checkLeases checks, for every key: no two mandates overlap in time
// (one ends before the next begins), fences strictly increase in the order
// the mandates began, and the longest time in [from, to] when no mandate
// of the key was believed (starvation). A gap longer than bound is a
// problem; a zero bound only measures the gaps.
func checkLeases(all []soakRun, from, to time.Time, bound time.Duration) leaseCheck {
	byKey := map[string][]soakRun{}
	var c leaseCheck
	problem := func(format string, args ...any) { c.problems = append(c.problems, fmt.Sprintf(format, args...)) }
	gap := func(key string, gap time.Duration, from, to time.Time) {
		c.worstGap = max(c.worstGap, gap)
		if bound > 0 && gap > bound {
			problem("%s: no mandate for %v (from %v to %v)", key, gap, from.Format("15:04:05.000"), to.Format("15:04:05.000"))
		}
	}
	for _, m := range all {
		byKey[m.key] = append(byKey[m.key], m)
		if m.lost {
			c.lostRuns++
		}
	}
	c.keys = len(byKey)
	for key, ms := range byKey {
		sort.Slice(ms, func(i, j int) bool { return ms[i].start.Before(ms[j].start) })
		for i := 1; i < len(ms); i++ {
			prev, cur := ms[i-1], ms[i]
			if cur.fence <= prev.fence {
				c.inversions++
				problem("%s: mandate fence %d (%s, from %v) began after fence %d (%s)", key, cur.fence, cur.replica, cur.start, prev.fence, prev.replica)
			}
			if prev.replica != cur.replica {
				c.takeovers++
			}
		}
		// Overlap: any two mandates, not only neighbours.
		for i := range ms {
			for j := i + 1; j < len(ms) && ms[j].start.Before(ms[i].end); j++ {
				c.overlaps++
				problem("%s: fence %d (%s) believed until %v, %v past its server expiry (lost: %v); fence %d (%s) began at %v: overlap %v",
					key, ms[i].fence, ms[i].replica, ms[i].end.Format("15:04:05.000"), ms[i].end.Sub(ms[i].expiry), ms[i].lost,
					ms[j].fence, ms[j].replica, ms[j].start.Format("15:04:05.000"), ms[i].end.Sub(ms[j].start))
			}
		}
		covered := from
		for _, m := range ms {
			if m.start.After(to) {
				break
			}
			if g := m.start.Sub(covered); g > 0 {
				gap(key, g, covered, m.start)
			}
			if m.end.After(covered) {
				covered = m.end
			}
		}
		if g := to.Sub(covered); g > 0 {
			gap(key, g, covered, to)
		}
	}
	return c
}
