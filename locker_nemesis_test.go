package pglease_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"os"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	lin "github.com/pglease/pglease/internal/history"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

var (
	nemesisFor     = flag.Duration("nemesis.duration", 60*time.Second, "how long TestNemesis's workload runs under faults")
	nemesisSeed    = flag.Int64("nemesis.seed", 0, "seed of TestNemesis's workload and faults (0: from the clock)")
	nemesisCheckIn = flag.Duration("nemesis.check", 30*time.Second, "how long porcupine may search TestNemesis's history")
	nemesisOnly    = flag.String("nemesis.faults", "", "the faults TestNemesis injects, by name, comma-separated (empty: all)")
)

// The terms of the nemesis run. The jobs' min holds stay below the
// heartbeat interval: a give-back that lands between a claim's min hold
// and its first heartbeat then expires the row at once, and a job's TTL
// shorter than the Locker's makes a re-entrant claim shorten the row.
const (
	nemesisKeys     = 4
	nemesisLockers  = 3 // Lockers with workers; Lockers 0 and 1 go through a NemesisDB
	nemesisElectors = 2 // Elector 0 goes through a NemesisDB
	nemesisWorkers  = 3
	nemesisTTL      = 2 * time.Second
	nemesisBeat     = 400 * time.Millisecond
	nemesisTimeout  = time.Second
	nemesisLeader   = "leader"
)

// nemesisJobs are the terms of each Locker's jobs: a short TTL, for
// re-entrant claims that shorten the row, and a long one.
var nemesisJobs = [][]pglease.Option{
	{pglease.WithTTL(time.Second), pglease.WithMinHold(100 * time.Millisecond)},
	{pglease.WithTTL(3 * time.Second), pglease.WithMinHold(50 * time.Millisecond)},
}

// nemesisTickJobs are the jobs of ticks each Locker runs, on keys of
// their own: at most once, and with catch-up. Their period is short, so
// that a run sees many ticks, and their TTL (nemesisTickTTL) the shortest
// the Locker's heartbeat allows, so that a lapsed run is caught up within
// a few periods.
var nemesisTickJobs = []struct {
	key     string
	catchUp bool
}{{"ticks", false}, {"catchup", true}}

const (
	nemesisPeriod  = 400 * time.Millisecond
	nemesisTickTTL = time.Second
)

// nemesisMaxMinHold is the longest min hold of the Locker and its jobs: a
// row released by Close stays live until acquired_at plus that.
const nemesisMaxMinHold = 100 * time.Millisecond

// leftBehindSQL finds the rows of a closed Locker's holder that a claim
// made after fence $2 wrote and nothing released: live, and live past the
// longest min hold ($3) a release keeps.
const leftBehindSQL = `SELECT key, fence, extract(epoch FROM expires_at - acquired_at)::float8 FROM %s
 WHERE holder = $1 AND fence > $2 AND expires_at > clock_timestamp()
   AND expires_at > acquired_at + make_interval(secs => $3) + interval '1 millisecond'`

// lastFenceSQL reads the last fence the table's sequence issued.
const lastFenceSQL = `SELECT last_value FROM %s`

// readRowSQL is the observer's read of one key: the row's mandate and
// whether it is live, by the same clock and test as every statement.
const readRowSQL = `SELECT holder, fence, expires_at > clock_timestamp() FROM %s WHERE key = $1`

// claimer is a Locker or one of its jobs.
type claimer interface {
	Claim(ctx context.Context, key string) (*pglease.Lease, error)
}

// nemesisLease is a lease handed to a caller of the workload, and the last
// time it was seen trusted.
type nemesisLease struct {
	key, holder string
	fence       int64
	returned    time.Time

	mu      sync.Mutex
	trusted time.Time
}

// poll asks lease whether it is still trusted, timing the question before
// it is asked, and records the answer.
func (nl *nemesisLease) poll(lease *pglease.Lease) bool {
	before := time.Now()
	if lease.Err() != nil {
		return false
	}
	nl.mu.Lock()
	nl.trusted = before
	nl.mu.Unlock()
	return true
}

// nemesisWrite is one guarded ledger transaction, as its caller saw it.
type nemesisWrite struct {
	client      int
	token       string
	key, holder string
	fence       int64
	careless    bool
	call, ret   time.Time
	guardErr    error
	committed   bool // the caller saw COMMIT succeed
}

// nemesisSlot is one Locker or Elector position: its proxy, pool and
// NemesisDB outlive its incarnations, each with a holder of its own.
type nemesisSlot struct {
	name    string
	index   int
	elector bool
	proxy   *faultproxy.Proxy
	pool    *pgxpool.Pool
	app     string
	nem     *pgtest.NemesisDB // nil: the Locker runs on the pool itself

	gen     int
	holder  string
	locker  *pglease.Locker
	jobs    []*pglease.JobLocker
	ticks   []*pglease.JobLocker // nemesisTickJobs, in order
	elec    *pglease.Elector
	elecOn  *pglease.Locker // the Locker the Elector is made from
	stop    chan struct{}
	workers sync.WaitGroup

	mu        sync.Mutex
	held      map[string]*pglease.Lease // leases its workers hold, for re-entrant claims
	lastClaim time.Time                 // an Elector's last claim outcome: its next claim is sent after it
	elected   map[int64]time.Time       // an Elector's leases, when their claims returned
	leaders   map[int64]*nemesisLease
	aims      map[string]bool // the aimed faults under way
	cutOff    chan struct{}   // closed by the catch-up job's worker at its next run, for aimCutOff
	recent    []string        // its Locker's last events, for the report of a row left behind
}

// nemesisRecent is how many of a slot's last events it keeps.
const nemesisRecent = 64

// remember keeps ev among the slot's last events.
func (s *nemesisSlot) remember(at time.Time, ev pglease.Event) {
	line := fmt.Sprintf("%s %s %v %s fence %d took %v: %v", at.Format("15:04:05.000"), ev.Holder, ev.Kind, ev.Key, ev.Fence, ev.Took, ev.Err)
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.recent) == nemesisRecent {
		s.recent = append(s.recent[:0], s.recent[1:]...)
	}
	s.recent = append(s.recent, line)
}

// recentOf is the slot's last events of key by holder.
func (s *nemesisSlot) recentOf(holder, key string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []string
	for _, line := range s.recent {
		if strings.Contains(line, " "+holder+" ") && strings.Contains(line, " "+key+" fence ") {
			out = append(out, line)
		}
	}
	return out
}

// aim reports whether the aimed fault of kind may start on s: one at a
// time, or the second would undo what the first set up.
func (s *nemesisSlot) aim(kind string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.aims == nil {
		s.aims = map[string]bool{}
	}
	if s.aims[kind] {
		return false
	}
	s.aims[kind] = true
	return true
}

// aimed ends the aimed fault of kind.
func (s *nemesisSlot) aimed(kind string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.aims, kind)
}

func (s *nemesisSlot) db() pglease.DB {
	if s.nem != nil {
		return s.nem
	}
	return s.pool
}

// nemesisRun is one run of the nemesis test: its server, its history and
// what the direct checks need.
type nemesisRun struct {
	t      *testing.T
	seed   int64
	server *pgserver.Server
	admin  *pgxpool.Pool
	table  string
	ledger string
	insert string
	rec    *lin.Recorder
	slots  []*nemesisSlot

	mu        sync.Mutex
	leases    []*nemesisLease
	takeovers []lin.Takeover
	grants    []lin.Grant
	writes    []*nemesisWrite
	exempt    []nemesisExemption
	leftovers []string
	faults    map[string]int
	timeline  []string // every fault, when and on what, for a failure's report
	tokens    int
	syncWaits int          // the most commits seen waiting at once for an unanswered synchronous standby
	outages   []lin.Outage // when no synchronous commit could be confirmed
}

// nemesisExemption takes the leases of key that an operator's ForceExpire
// may have cut short out of the overlap check: the one of fence, or when
// fence is 0 every one handed out before.
type nemesisExemption struct {
	key    string
	fence  int64
	before time.Time
}

// TestNemesis runs a randomized workload on one table of a private
// server: three Lockers with three workers each (plain claims, waiting claims whose
// contexts end at random, re-entrant claims by jobs with their own terms,
// guarded ledger writes, some by careless workers that commit whatever
// Guard says, and releases), two jobs of ticks on each Locker (at most
// once, and with catch-up) locked at each tick, two Electors, an observer
// reading rows, and
// a nemesis that loses replies after commit, delivers statements after
// their sender gave up, partitions and stalls the Lockers' networks,
// resets connections, restarts the server, makes commits wait for a
// synchronous standby that never answers, jumps wall clocks, revokes and
// force-expires leases, locks rows, exhausts pools and closes Lockers
// while their claims are in flight. Every call and return is recorded;
// porcupine checks the history per key against a model of the mandate,
// and per tick of each job against a model of its runs (at most one
// completes, none begins after), the ledger of runs has no tick completed
// twice, and the trust windows, fences, ledger, rows left behind at Close and
// claims handed out while no synchronous standby could confirm them are
// checked directly.
func TestNemesis(t *testing.T) {
	t.Parallel()
	// Guarantee: under every fault injected, each key's history is
	// linearizable and no two holders' leases of a key overlap.
	t.Run("HistoriesAreLinearizable", func(t *testing.T) {
		t.Parallel()
		seed := *nemesisSeed
		if seed == 0 {
			seed = time.Now().UnixNano()
		}
		t.Logf("nemesis seed %d (replay with -nemesis.seed=%d), duration %v", seed, seed, *nemesisFor)
		defer func() {
			if t.Failed() {
				t.Logf("nemesis seed %d failed (replay with -args -nemesis.seed=%d)", seed, seed)
			}
		}()
		rnd := rand.New(rand.NewSource(seed))

		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		srv, err := pgserver.Start(ctx, pgserver.Options{Private: true})
		cancel()
		require.NoError(t, err)
		t.Cleanup(func() { _ = srv.Close() })

		r := &nemesisRun{t: t, seed: seed, server: srv, faults: map[string]int{}}
		t.Cleanup(func() {
			if t.Failed() {
				r.mu.Lock()
				defer r.mu.Unlock()
				t.Logf("the faults of the run, in order:\n%s", strings.Join(r.timeline, "\n"))
			}
		})
		// The operator's changes commit durably: the server's default does
		// not, and a crash must not undo a revoke that was reported done.
		r.admin = pgtest.PoolWith(t, srv.DSN(), func(cfg *pgxpool.Config) {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "on"
			cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		})
		r.table = pgtest.Table(t, r.admin)
		r.ledger, r.insert = pgtest.NewCommitOrderedLedger(t, r.admin)
		// The server commits asynchronously by default: a crash right away
		// would lose the tables.
		_, err = r.admin.Exec(context.Background(), `CHECKPOINT`)
		require.NoError(t, err)
		began := time.Now()
		r.rec = lin.NewRecorder(began)

		for i := range nemesisLockers + nemesisElectors {
			s := &nemesisSlot{index: i, elector: i >= nemesisLockers}
			s.name = fmt.Sprintf("locker%d", i)
			if s.elector {
				s.name = fmt.Sprintf("elector%d", i-nemesisLockers)
			}
			s.proxy = pgtest.Proxy(t, srv.DSN())
			s.app = pgtest.AppName("nemesis_" + s.name)
			s.pool = pgtest.AppPool(t, srv.DSN(), s.proxy, s.app)
			if i == 0 || i == 1 || i == nemesisLockers {
				s.nem = pgtest.NewNemesisDB(t, s.pool, seed+int64(i))
			}
			r.slots = append(r.slots, s)
			r.start(s)
		}
		stopObserver := make(chan struct{})
		var observer sync.WaitGroup
		observer.Go(func() { r.observe(rand.New(rand.NewSource(seed-1)), stopObserver) })

		deadline := began.Add(*nemesisFor)
		for time.Now().Before(deadline) {
			r.injectFault(rnd)
			time.Sleep(time.Duration(50+rnd.Intn(250)) * time.Millisecond) // spacing between faults
		}
		close(stopObserver)
		observer.Wait()
		for _, s := range r.slots {
			r.closeRace(s, rnd, false) // every Locker and Elector closes last with claims in flight
		}
		ran := time.Since(began)
		r.check(ran)
	})
}

// start starts a new incarnation of s: a Locker (and its jobs) or an
// Elector with a holder of its own, and its workers.
func (r *nemesisRun) start(s *nemesisSlot) {
	s.gen++
	s.stop = make(chan struct{})
	s.mu.Lock()
	s.held = map[string]*pglease.Lease{}
	s.elected, s.leaders = map[int64]time.Time{}, map[int64]*nemesisLease{}
	s.lastClaim = time.Now()
	s.mu.Unlock()
	opts := []pglease.Option{pglease.WithTable(r.table), pglease.WithHolder(fmt.Sprintf("%s.%d", s.name, s.gen)), pglease.WithLogger(pgtest.Quiet),
		pglease.WithTTL(nemesisTTL), pglease.WithHeartbeatInterval(nemesisBeat), pglease.WithTimeout(nemesisTimeout),
		pglease.WithHook(r.hook(s))}
	if s.elector {
		s.elecOn = pgtest.Each(pglease.NewLocker(s.db(), opts...))
		s.holder = s.elecOn.Holder()
		var err error
		s.elec, err = pglease.NewElector(s.elecOn, nemesisLeader)
		require.NoError(r.t, err)
		e, stop := s.elec, s.stop
		rnd := rand.New(rand.NewSource(r.seed + int64(1000*s.index+s.gen)))
		s.workers.Go(func() { r.electorWorker(s, e, rnd, stop) })
		return
	}
	s.locker = pgtest.Each(pglease.NewLocker(s.db(), opts...))
	s.holder = s.locker.Holder()
	s.jobs = nil
	for _, terms := range nemesisJobs {
		j, err := s.locker.Job(terms...)
		require.NoError(r.t, err)
		s.jobs = append(s.jobs, j)
	}
	for w := range nemesisWorkers {
		holder, l, jobs, stop := s.holder, s.locker, s.jobs, s.stop
		rnd := rand.New(rand.NewSource(r.seed + int64(1000*s.index+100*w+s.gen)))
		client := 10*s.index + w
		s.workers.Go(func() { r.lockerWorker(s, holder, l, jobs, client, rnd, stop) })
	}
	s.ticks = nil
	for i, job := range nemesisTickJobs {
		terms := []pglease.Option{pglease.WithPeriod(nemesisPeriod), pglease.WithTTL(nemesisTickTTL)}
		if job.catchUp {
			terms = append(terms, pglease.WithCatchUp())
		}
		j, err := s.locker.Job(terms...)
		require.NoError(r.t, err)
		s.ticks = append(s.ticks, j)
		holder, stop := s.holder, s.stop
		rnd := rand.New(rand.NewSource(r.seed + int64(1000*s.index+100*(nemesisWorkers+i)+s.gen)))
		client := 800 + 10*s.index + i
		key, catchUp := job.key, job.catchUp
		s.workers.Go(func() { r.tickWorker(s, holder, j, key, catchUp, client, rnd, stop) })
	}
}

// hook records, for every Locker and Elector, the rows its claims wrote
// (the overlap check's takeovers), and an Elector's claims, which its
// campaign makes one after the other: each is sent after the outcome of
// the one before.
func (r *nemesisRun) hook(s *nemesisSlot) func(pglease.Event) {
	client := 300 + s.index
	return func(ev pglease.Event) {
		now := time.Now()
		s.remember(now, ev)
		holder := ev.Holder // the Locker's own: every event here is of its claims
		switch ev.Kind {
		case pglease.EventAcquired, pglease.EventClaimFailed:
			if ev.Fence != 0 {
				r.mu.Lock()
				r.takeovers = append(r.takeovers, lin.Takeover{Key: ev.Key, Holder: holder, Fence: ev.Fence, At: now})
				r.mu.Unlock()
			}
		}
		if !s.elector || ev.Key != nemesisLeader {
			return
		}
		switch ev.Kind {
		case pglease.EventAcquired, pglease.EventContended, pglease.EventClaimFailed:
		default:
			return
		}
		s.mu.Lock()
		call := s.lastClaim
		s.lastClaim = now
		if ev.Kind == pglease.EventAcquired {
			s.elected[ev.Fence] = now
		}
		s.mu.Unlock()
		in := lin.Input{Key: nemesisLeader, Kind: lin.Claim, Holder: holder}
		switch ev.Kind {
		case pglease.EventAcquired:
			r.rec.Add(client, in, call, lin.Output{Outcome: lin.Got, Fence: ev.Fence}, now)
			r.mu.Lock()
			r.grants = append(r.grants, lin.Grant{Key: nemesisLeader, Holder: holder, Fence: ev.Fence, Call: call, Return: now})
			r.mu.Unlock()
		case pglease.EventContended:
			r.rec.Add(client, in, call, lin.Output{Outcome: lin.Held}, now)
		default:
			r.rec.AddOpen(client, in, call, lin.Output{Outcome: lin.Unknown})
		}
	}
}

func stopped(stop <-chan struct{}) bool {
	select {
	case <-stop:
		return true
	default:
		return false
	}
}

func (r *nemesisRun) key(rnd *rand.Rand) string { return fmt.Sprintf("k%d", rnd.Intn(nemesisKeys)) }

// operatedKey is the key an operator's revoke or force-expire hits: a
// worker's, or one time in four a job's of ticks.
func (r *nemesisRun) operatedKey(rnd *rand.Rand) string {
	if rnd.Intn(4) == 0 {
		return nemesisTickJobs[rnd.Intn(len(nemesisTickJobs))].key
	}
	return r.key(rnd)
}

func between(rnd *rand.Rand, lo, hi time.Duration) time.Duration {
	return lo + time.Duration(rnd.Int63n(int64(hi-lo)+1))
}

// lockerWorker runs one worker of a Locker's incarnation until stop.
func (r *nemesisRun) lockerWorker(s *nemesisSlot, holder string, l *pglease.Locker, jobs []*pglease.JobLocker, client int, rnd *rand.Rand, stop <-chan struct{}) {
	terms := func() claimer {
		if i := rnd.Intn(3); i < len(jobs) {
			return jobs[i]
		}
		return l
	}
	for !stopped(stop) {
		var (
			lease *pglease.Lease
			nl    *nemesisLease
		)
		switch x := rnd.Intn(100); {
		case x < 40: // a plain claim, given up on at random
			lease, nl = r.claim(client, holder, terms(), l, r.key(rnd), between(rnd, 20*time.Millisecond, time.Second), false)
		case x < 65: // a waiting claim whose context ends at random
			lease, nl = r.claim(client, holder, l, l, r.key(rnd), between(rnd, 5*time.Millisecond, 1500*time.Millisecond), true)
		case x < 85: // a re-entrant claim of a key the Locker holds, mostly by the job of the shortest TTL
			key := s.heldKey(rnd)
			if key == "" {
				key = r.key(rnd)
			}
			var c claimer = jobs[0]
			if rnd.Intn(3) == 0 {
				c = terms()
			}
			lease, nl = r.claim(client, holder, c, l, key, between(rnd, 50*time.Millisecond, time.Second), false)
		default:
			time.Sleep(between(rnd, 5*time.Millisecond, 50*time.Millisecond)) // a worker between jobs
		}
		if lease != nil {
			r.hold(client, s, lease, nl, rnd, stop)
		} else {
			time.Sleep(between(rnd, time.Millisecond, 20*time.Millisecond)) // a job that did not run waits for its next tick
		}
	}
}

// claim claims key through c (or, waiting, through l's ClaimWait) within
// limit, and records the operation and the lease it handed out.
func (r *nemesisRun) claim(client int, holder string, c claimer, l *pglease.Locker, key string, limit time.Duration, wait bool) (*pglease.Lease, *nemesisLease) {
	ctx, cancel := context.WithTimeout(context.Background(), limit)
	defer cancel()
	call := time.Now()
	var (
		lease *pglease.Lease
		err   error
	)
	if wait {
		lease, err = l.ClaimWait(ctx, key)
	} else {
		lease, err = c.Claim(ctx, key)
	}
	ret := time.Now()
	return lease, r.claimed(client, holder, key, call, ret, lease, err, wait)
}

// claimed records the outcome of a claim called at call that returned at
// ret: the fence it handed out (and the tick, for a job of ticks), held (a
// plain claim's ErrHeld wrote nothing), or unknown.
func (r *nemesisRun) claimed(client int, holder, key string, call, ret time.Time, lease *pglease.Lease, err error, wait bool) *nemesisLease {
	in := lin.Input{Key: key, Kind: lin.Claim, Holder: holder}
	switch {
	case err == nil:
		in.Tick = lease.Tick()
		r.rec.Add(client, in, call, lin.Output{Outcome: lin.Got, Fence: lease.Fence()}, ret)
		nl := &nemesisLease{key: key, holder: holder, fence: lease.Fence(), returned: ret}
		r.mu.Lock()
		r.grants = append(r.grants, lin.Grant{Key: key, Holder: holder, Fence: lease.Fence(), Call: call, Return: ret})
		r.leases = append(r.leases, nl)
		r.mu.Unlock()
		return nl
	case !wait && errors.Is(err, pglease.ErrHeld):
		r.rec.Add(client, in, call, lin.Output{Outcome: lin.Held}, ret)
	default:
		r.rec.AddOpen(client, in, call, lin.Output{Outcome: lin.Unknown})
	}
	return nil
}

func (s *nemesisSlot) heldKey(rnd *rand.Rand) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	keys := make([]string, 0, len(s.held))
	for k := range s.held {
		keys = append(keys, k)
	}
	if len(keys) == 0 {
		return ""
	}
	sort.Strings(keys)
	return keys[rnd.Intn(len(keys))]
}

// hold uses a lease as a job would: it asks whether it is still trusted
// every few milliseconds, writes to the ledger under Guard (carelessly, at
// times: whatever Guard said), and then releases it, or walks away from it
// and leaves it to the Locker, or writes again after the release as a
// careless job would.
func (r *nemesisRun) hold(client int, s *nemesisSlot, lease *pglease.Lease, nl *nemesisLease, rnd *rand.Rand, stop <-chan struct{}) {
	s.mu.Lock()
	s.held[lease.Key()] = lease
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		if s.held[lease.Key()] == lease {
			delete(s.held, lease.Key())
		}
		s.mu.Unlock()
	}()
	careless := rnd.Intn(3) == 0
	writes := rnd.Intn(3)
	until := time.Now().Add(between(rnd, 50*time.Millisecond, 800*time.Millisecond))
	if rnd.Intn(4) == 0 {
		until = time.Now().Add(between(rnd, time.Second, 3*time.Second)) // a long job
	}
	for time.Now().Before(until) && !stopped(stop) {
		if !nl.poll(lease) && !careless {
			break
		}
		if writes > 0 && rnd.Intn(6) == 0 {
			writes--
			r.write(client, s.pool, lease, careless)
		}
		time.Sleep(between(rnd, 2*time.Millisecond, 15*time.Millisecond)) // the job's work between two looks at its lease
	}
	switch x := rnd.Intn(10); {
	case x < 7:
		r.unlock(client, lease)
	case x < 9:
		r.unlock(client, lease)
		r.write(client, s.pool, lease, true) // a careless job writes after its Unlock
	default: // walks away: the Locker keeps it until a re-entrant claim or Close
	}
}

// unlock releases lease and records the outcome.
func (r *nemesisRun) unlock(client int, lease *pglease.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), nemesisTimeout)
	defer cancel()
	in := lin.Input{Key: lease.Key(), Kind: lin.Release, Holder: lease.Holder(), Fence: lease.Fence(), Tick: lease.Tick()}
	call := time.Now()
	err := lease.Unlock(ctx)
	ret := time.Now()
	switch {
	case err == nil:
		r.rec.Add(client, in, call, lin.Output{Outcome: lin.OK}, ret)
	case errors.Is(err, pglease.ErrLost):
		r.rec.Add(client, in, call, lin.Output{Outcome: lin.Lost}, ret)
	default:
		r.rec.AddOpen(client, in, call, lin.Output{Outcome: lin.Unknown})
	}
}

// write appends a ledger row for lease in a transaction of pool, calls
// Guard last and commits; a careless writer commits whatever Guard said.
// Its outcome is read from the ledger at the end.
func (r *nemesisRun) write(client int, pool *pgxpool.Pool, lease *pglease.Lease, careless bool) {
	r.mu.Lock()
	r.tokens++
	w := &nemesisWrite{client: client, token: fmt.Sprintf("t%d", r.tokens), key: lease.Key(), holder: lease.Holder(),
		fence: lease.Fence(), careless: careless, call: time.Now()}
	r.writes = append(r.writes, w)
	r.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), nemesisTimeout)
	defer cancel()
	defer func() { w.ret = time.Now() }()
	tx, err := pool.Begin(ctx)
	if err != nil {
		return
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, r.insert, w.key, w.holder, w.fence, w.token); err != nil {
		return
	}
	w.guardErr = lease.Guard(ctx, tx)
	if w.guardErr != nil && !careless {
		return
	}
	w.committed = tx.Commit(ctx) == nil
}

// tickWorker runs a job of ticks on a Locker's incarnation as gocron would,
// until stop: at each tick of the period's grid by its own clock, a
// little off it as replicas' clocks are, it locks the job through its
// JobLocker and, if it got the tick, runs it (runTick).
func (r *nemesisRun) tickWorker(s *nemesisSlot, holder string, j *pglease.JobLocker, key string, catchUp bool, client int, rnd *rand.Rand, stop <-chan struct{}) {
	var tick time.Time // the last tick of the grid it locked at
	for {
		next := time.Now().Truncate(nemesisPeriod).Add(nemesisPeriod)
		if !next.After(tick) {
			next = tick.Add(nemesisPeriod)
		}
		tick = next
		select {
		case <-time.After(time.Until(tick.Add(between(rnd, -nemesisPeriod/4, nemesisPeriod/4)))): // the job's next tick, by this replica's clock
		case <-stop:
			return
		}
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
		call := time.Now()
		lock, err := j.Lock(ctx, key)
		ret := time.Now()
		cancel()
		lease, _ := lock.(*pglease.Lease)
		// A Lock that catches up may wait for the tick's run to end, and its
		// ErrHeld then says nothing of the attempts it made meanwhile.
		nl := r.claimed(client, holder, key, call, ret, lease, err, catchUp)
		if lease == nil {
			continue
		}
		if catchUp && s.cutOffNow() {
			// A run cut off from the database: it runs on until its lease
			// is no longer trusted, then walks away (its Locker holds it
			// until then, and its Locks of the job are refused). Unless
			// the cut came too late for it: then it ends as any run.
			r.trustFor(lease, nl, 3*nemesisTickTTL, stop)
			if nl.poll(lease) {
				r.unlock(client, lease)
			}
			continue
		}
		r.runTick(client, s, lease, nl, rnd, stop)
	}
}

// cutOffNow reports whether an aimCutOff waits for this run, and tells it.
func (s *nemesisSlot) cutOffNow() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cutOff == nil {
		return false
	}
	close(s.cutOff)
	s.cutOff = nil
	return true
}

// runTick runs the job of a tick on its lease: it asks the lease whether
// it is still trusted every few milliseconds for a short run or, at times,
// one that outlasts the period (the next ticks are skipped meanwhile),
// writes to the ledger under Guard at times, and unlocks it.
func (r *nemesisRun) runTick(client int, s *nemesisSlot, lease *pglease.Lease, nl *nemesisLease, rnd *rand.Rand, stop <-chan struct{}) {
	until := time.Now().Add(between(rnd, 5*time.Millisecond, 150*time.Millisecond))
	if rnd.Intn(8) == 0 {
		until = time.Now().Add(between(rnd, nemesisPeriod, 3*nemesisPeriod)) // a run longer than its period
	}
	for time.Now().Before(until) && !stopped(stop) && nl.poll(lease) {
		time.Sleep(between(rnd, 2*time.Millisecond, 15*time.Millisecond)) // the run's work between two looks at its lease
	}
	if rnd.Intn(4) == 0 {
		r.write(client, s.pool, lease, false)
	}
	r.unlock(client, lease)
}

// electorWorker asks an Elector's incarnation whether it leads, or
// campaigns, and uses its leadership lease while it does, until stop.
func (r *nemesisRun) electorWorker(s *nemesisSlot, e *pglease.Elector, rnd *rand.Rand, stop <-chan struct{}) {
	client := 10*s.index + 1
	for !stopped(stop) {
		ctx, cancel := context.WithTimeout(context.Background(), between(rnd, 10*time.Millisecond, time.Second))
		var lease *pglease.Lease
		if rnd.Intn(4) == 0 {
			lease, _ = e.Campaign(ctx)
		} else if e.IsLeader(ctx) == nil {
			lease, _ = e.Leader()
		}
		cancel()
		if lease != nil {
			nl := r.leader(s, lease)
			until := time.Now().Add(between(rnd, 50*time.Millisecond, 500*time.Millisecond))
			careless := rnd.Intn(3) == 0
			for time.Now().Before(until) && !stopped(stop) && (nl.poll(lease) || careless) {
				if rnd.Intn(10) == 0 {
					r.write(client, s.pool, lease, careless)
				}
				time.Sleep(between(rnd, 2*time.Millisecond, 15*time.Millisecond)) // the leader's work between two looks
			}
		}
		time.Sleep(between(rnd, 10*time.Millisecond, 100*time.Millisecond)) // the elector's pace
	}
}

// leader is the record of an Elector's leadership lease, made at its first
// sight: its claim returned when the hook saw it acquired.
func (r *nemesisRun) leader(s *nemesisSlot, lease *pglease.Lease) *nemesisLease {
	s.mu.Lock()
	defer s.mu.Unlock()
	if nl, ok := s.leaders[lease.Fence()]; ok {
		return nl
	}
	nl := &nemesisLease{key: lease.Key(), holder: lease.Holder(), fence: lease.Fence(), returned: s.elected[lease.Fence()]}
	s.leaders[lease.Fence()] = nl
	r.mu.Lock()
	r.leases = append(r.leases, nl)
	r.mu.Unlock()
	return nl
}

// observe reads a random key's row every few milliseconds until stop.
func (r *nemesisRun) observe(rnd *rand.Rand, stop <-chan struct{}) {
	query := fmt.Sprintf(readRowSQL, pgx.Identifier{r.table}.Sanitize())
	for !stopped(stop) {
		all := r.keys()
		r.read(200, query, all[rnd.Intn(len(all))])
		time.Sleep(between(rnd, 5*time.Millisecond, 30*time.Millisecond)) // the observer's pace
	}
}

// read records one read of key's row; a failed read is no operation.
func (r *nemesisRun) read(client int, query, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), nemesisTimeout)
	defer cancel()
	var out lin.Output
	call := time.Now()
	err := r.admin.QueryRow(ctx, query, key).Scan(&out.Holder, &out.Fence, &out.Live)
	ret := time.Now()
	switch {
	case err == nil:
		out.Outcome = lin.Seen
	case errors.Is(err, pgx.ErrNoRows):
		out.Outcome = lin.NotFound
	default:
		return
	}
	r.rec.Add(client, lin.Input{Key: key, Kind: lin.Read}, call, out, ret)
}

// nemesisFault is one kind of fault: inject applies it to slot s (or to
// the server, or a key) and heals it, window being a random length for it.
type nemesisFault struct {
	name   string
	weight int
	on     func(s *nemesisSlot) bool // the slots it applies to; nil: any
	inject func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, window time.Duration)
	// notes: inject notes the fault itself (r.fault), naming what it hit
	// (the server, a key) rather than the slot.
	notes bool
	// optIn: only when -nemesis.faults names it.
	optIn bool
}

func wrapped(s *nemesisSlot) bool       { return s.nem != nil }
func wrappedLocker(s *nemesisSlot) bool { return s.nem != nil && !s.elector }
func aLocker(s *nemesisSlot) bool       { return !s.elector }

// nemesisFaults are the faults the nemesis draws from, by weight.
var nemesisFaults = []nemesisFault{
	{"lost replies", 12, wrapped, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, window time.Duration) {
		s.nem.LoseReplies("claim", 0.3+0.7*rnd.Float64())
		s.nem.LoseReplies("heartbeat", []float64{0, 0.5, 1}[rnd.Intn(3)])
		s.nem.LoseReplies("release", 0.5*rnd.Float64())
		time.Sleep(window) // the fault's length, not a wait for an outcome
		s.nem.Heal()
	}, false, false},
	// A re-entrant claim that shortens the row and loses its reply, while
	// the heartbeat's replies are lost too.
	{"lost claim and heartbeat replies", 10, wrappedLocker, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		r.aimReentrant(s, rnd, func() {
			s.nem.LoseReplies("claim", 1)
			s.nem.LoseReplies("heartbeat", 1)
		})
		time.Sleep(between(rnd, 1500*time.Millisecond, 3*time.Second)) // the fault's length
		s.nem.Heal()
	}, false, false},
	{"late statements", 8, wrapped, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, window time.Duration) {
		within := between(rnd, 100*time.Millisecond, 1500*time.Millisecond)
		for _, k := range []string{"claim", "heartbeat", "release"} {
			s.nem.DeliverLate(k, 0.2+0.6*rnd.Float64(), 0, within)
		}
		time.Sleep(window) // the fault's length
		s.nem.Heal()
	}, false, false},
	// The give-backs of waiting claims that failed, and releases, arrive
	// after the Locker claimed the key again.
	{"late releases", 12, wrappedLocker, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		// Past the longest min hold (a give-back keeps it), and mostly
		// before the newer lease's first heartbeat.
		s.nem.DeliverLate("release", 0.8+0.2*rnd.Float64(), 120*time.Millisecond, 350*time.Millisecond)
		length := between(rnd, 3*time.Second, 5*time.Second)
		r.aimGiveBack(s, rnd, time.Now().Add(length))
		time.Sleep(length) // the fault's length
		s.nem.Heal()
	}, false, false},
	{"partition", 7, nil, func(r *nemesisRun, s *nemesisSlot, _ *rand.Rand, window time.Duration) {
		s.proxy.SetMode(faultproxy.Blackhole)
		time.Sleep(window) // the fault's length
		s.proxy.SetMode(faultproxy.Forward)
	}, false, false},
	{"stall", 7, nil, func(r *nemesisRun, s *nemesisSlot, _ *rand.Rand, window time.Duration) {
		s.proxy.SetMode(faultproxy.Stall)
		time.Sleep(window) // the fault's length
		s.proxy.SetMode(faultproxy.Forward)
	}, false, false},
	{"reset", 4, nil, func(r *nemesisRun, s *nemesisSlot, _ *rand.Rand, _ time.Duration) { s.proxy.ResetAll() }, false, false},
	{"restart", 4, nil, func(r *nemesisRun, _ *nemesisSlot, rnd *rand.Rand, _ time.Duration) { r.restart(rnd) }, true, false},
	{"wall clock jump", 6, aLocker, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, window time.Duration) {
		d := between(rnd, 500*time.Millisecond, 5*time.Second)
		if rnd.Intn(2) == 0 {
			d = -d
		}
		pglease.ShiftWallClock(s.locker, d)
		time.Sleep(window) // the fault's length
		pglease.ShiftWallClock(s.locker, 0)
	}, false, false},
	{"revoke", 6, nil, func(r *nemesisRun, _ *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		r.operator(lin.Revoke, r.operatedKey(rnd))
	}, true, false},
	{"force-expire", 4, nil, func(r *nemesisRun, _ *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		key := r.operatedKey(rnd)
		if rnd.Intn(4) == 0 {
			key = nemesisLeader
		}
		r.operator(lin.ForceExpire, key)
	}, true, false},
	{"row lock", 7, nil, func(r *nemesisRun, _ *nemesisSlot, rnd *rand.Rand, window time.Duration) {
		key := r.key(rnd)
		defer r.fault("row lock", key)()
		tx := pgtest.LockRows(r.t, r.admin, r.table, "key = $1", key)
		time.Sleep(window) // the fault's length
		_ = tx.Rollback(context.Background())
	}, true, false},
	{"pool exhausted", 6, nil, func(r *nemesisRun, s *nemesisSlot, _ *rand.Rand, window time.Duration) {
		ctx, cancel := context.WithTimeout(context.Background(), nemesisTimeout)
		release, _ := pgtest.HoldConnections(ctx, s.pool)
		cancel()
		time.Sleep(window) // the fault's length
		release()
	}, false, false},
	{"close with claims in flight", 9, nil, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		r.closeRace(s, rnd, true)
	}, false, false},
	// Commits that wait for a synchronous standby that never answers:
	// claims and heartbeats commit synchronously whatever the server's
	// default, so each waits until its caller gives up (a claim's wait is
	// then cancelled, and committed on the server alone) or the standby is
	// named no more.
	{"unanswered synchronous standby", 8, nil, func(r *nemesisRun, _ *nemesisSlot, _ *rand.Rand, window time.Duration) {
		defer r.fault("unanswered synchronous standby", "the server")()
		ctx, cancel := context.WithTimeout(context.Background(), window+time.Minute)
		defer cancel()
		o, err := pgtest.WithoutStandby(ctx, r.admin, window)
		require.NoError(r.t, err)
		r.mu.Lock()
		r.syncWaits = max(r.syncWaits, o.Waiting)
		if !o.From.IsZero() {
			r.outages = append(r.outages, lin.Outage{From: o.From, Until: o.Until})
		}
		r.mu.Unlock()
	}, true, false},
	// A run of a tick cut off from the database, while the other Lockers
	// wait to catch it up.
	{"run of a tick cut off", 6, aLocker, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		r.aimCutOff(s, rnd)
	}, false, false},
	// A claim whose sender gave up, delivered after the Locker claimed the
	// key again, with a shorter TTL, while the heartbeat's replies are
	// lost.
	{"late claims", 10, wrappedLocker, func(r *nemesisRun, s *nemesisSlot, rnd *rand.Rand, _ time.Duration) {
		r.aimLateClaim(s, rnd)
		s.nem.Heal()
	}, false, false},
}

// injectFault injects one fault, drawn at random by weight (among those
// -nemesis.faults names, if it does), on a random slot it applies to, for
// a random time, and heals it.
func (r *nemesisRun) injectFault(rnd *rand.Rand) {
	var (
		fits  []nemesisFault
		total int
	)
	for _, f := range nemesisFaults {
		named := slices.Contains(strings.Split(*nemesisOnly, ","), f.name)
		if named || *nemesisOnly == "" && !f.optIn {
			fits = append(fits, f)
			total += f.weight
		}
	}
	if total == 0 {
		return
	}
	x := rnd.Intn(total)
	var f nemesisFault
	for _, f = range fits {
		if x -= f.weight; x < 0 {
			break
		}
	}
	var on []*nemesisSlot
	for _, s := range r.slots {
		if f.on == nil || f.on(s) {
			on = append(on, s)
		}
	}
	s := on[rnd.Intn(len(on))]
	window := between(rnd, 300*time.Millisecond, 2500*time.Millisecond)
	if !f.notes {
		defer r.fault(f.name, s.holder)()
	}
	f.inject(r, s, rnd, window)
}

// aimReentrant makes the case of a re-entrant claim that shortens the row
// and loses its reply: a lease of s of the Locker's TTL, trusted and
// asked about all along; the faults (replies of claims and heartbeats
// lost) switched on; a claim of the same key by s's job of the shortest
// TTL; and another Locker waiting for the key. The first lease must stop
// being trusted before that row expires and the other Locker takes it.
func (r *nemesisRun) aimReentrant(s *nemesisSlot, rnd *rand.Rand, faults func()) {
	if s.locker == nil || !s.aim("reentrant") {
		faults()
		return
	}
	key := aimKey("reentrant", s.index)
	holder, l, job, stop := s.holder, s.locker, s.jobs[0], s.stop
	client := 400 + s.index
	lease, nl := r.claim(client, holder, l, l, key, 2*time.Second, true)
	faults()
	if lease == nil {
		s.aimed("reentrant")
		return
	}
	wait := between(rnd, 0, 100*time.Millisecond)
	s.workers.Go(func() {
		defer s.aimed("reentrant")
		r.trustFor(lease, nl, 3*time.Second, stop)
		r.unlock(client, lease)
	})
	s.workers.Go(func() {
		select {
		case <-time.After(wait): // the job's tick comes a little later
		case <-stop:
			return
		}
		r.claim(client, holder, job, l, key, nemesisTimeout, false)
	})
	r.contend(s, key, rnd)
}

// aimGiveBack makes the case of a late give-back: waiting claims of s
// that give up while their claims are on their way (so that they give
// back what those claims may have written, and the give-back arrives
// late), each followed at once by a claim of the same key, trusted and
// asked about for a while, while another Locker waits for the key. A late
// give-back must not end the newer lease's row while it is trusted.
func (r *nemesisRun) aimGiveBack(s *nemesisSlot, rnd *rand.Rand, until time.Time) {
	if s.locker == nil || !s.aim("giveback") {
		return
	}
	key := aimKey("giveback", s.index)
	o := r.other(s, rnd)
	holder, l, stop := s.holder, s.locker, s.stop
	oholder, ol, ostop := o.holder, o.locker, o.stop
	s.nem.Slow(between(rnd, 10*time.Millisecond, 40*time.Millisecond))
	arnd := rand.New(rand.NewSource(rnd.Int63()))
	client, oclient := 500+s.index, 600+o.index
	// Both incarnations wait for it before they close.
	s.workers.Add(1)
	o.workers.Add(1)
	go func() {
		defer s.workers.Done()
		defer o.workers.Done()
		defer s.aimed("giveback")
		for time.Now().Before(until) {
			if stopped(stop) || stopped(ostop) {
				return
			}
			r.claim(client, holder, l, l, key, between(arnd, 2*time.Millisecond, 40*time.Millisecond), true)
			lease, nl := r.claim(client, holder, l, l, key, nemesisTimeout, false)
			if lease == nil {
				continue
			}
			var contender sync.WaitGroup
			contender.Go(func() {
				if lease, nl := r.claim(oclient, oholder, ol, ol, key, 1500*time.Millisecond, true); lease != nil {
					r.trustFor(lease, nl, 200*time.Millisecond, ostop)
					r.unlock(oclient, lease)
				}
			})
			r.trustFor(lease, nl, between(arnd, 500*time.Millisecond, time.Second), stop)
			r.unlock(client, lease)
			contender.Wait()
		}
	}()
}

// aimLateClaim makes the case of a late claim: a claim of s's job of the
// shortest TTL whose sender gives up at once, its statement delivered a
// few hundred milliseconds later; meanwhile a claim of the key on the
// Locker's terms, trusted and asked about, while the heartbeat's replies
// are lost and another Locker waits for the key. The late claim re-claims
// the row for the shorter TTL: the newer lease must not be trusted past it.
func (r *nemesisRun) aimLateClaim(s *nemesisSlot, rnd *rand.Rand) {
	if !s.aim("lateclaim") {
		return
	}
	defer s.aimed("lateclaim")
	key := aimKey("lateclaim", s.index)
	client := 700 + s.index
	s.nem.DeliverLate("claim", 1, 200*time.Millisecond, 600*time.Millisecond)
	r.claim(client, s.holder, s.jobs[0], s.locker, key, nemesisTimeout, false)
	s.nem.Heal()
	lease, nl := r.claim(client, s.holder, s.locker, s.locker, key, 2*time.Second, true)
	if lease == nil {
		return
	}
	s.nem.LoseReplies("heartbeat", 1)
	r.contend(s, key, rnd)
	r.trustFor(lease, nl, 3*time.Second, s.stop)
	r.unlock(client, lease)
}

// aimCutOff makes the case of a run of a tick that lapses: the network of
// s is cut (blackholed) as soon as its job with catch-up gets a tick, for
// longer than the job's TTL, while the other Lockers' Locks of that tick
// wait for its run to end. One of them must run the tick again, with a
// greater fence, and the cut-off run must not complete.
func (r *nemesisRun) aimCutOff(s *nemesisSlot, rnd *rand.Rand) {
	if !s.aim("cutoff") {
		return
	}
	defer s.aimed("cutoff")
	got := make(chan struct{})
	s.mu.Lock()
	s.cutOff = got
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		s.cutOff = nil
		s.mu.Unlock()
	}()
	select {
	case <-got:
	case <-time.After(5 * nemesisPeriod): // no tick got meanwhile: nothing to cut off
		return
	case <-s.stop:
		return
	}
	s.proxy.SetMode(faultproxy.Blackhole)
	time.Sleep(between(rnd, nemesisTickTTL+nemesisPeriod, 2*nemesisTickTTL+nemesisPeriod)) // the fault's length: past the lapse
	s.proxy.SetMode(faultproxy.Forward)
}

// trustFor asks lease whether it is trusted every few milliseconds for d,
// or until it is not, or stop.
func (r *nemesisRun) trustFor(lease *pglease.Lease, nl *nemesisLease, d time.Duration, stop <-chan struct{}) {
	until := time.Now().Add(d)
	for time.Now().Before(until) && !stopped(stop) && nl.poll(lease) {
		time.Sleep(2 * time.Millisecond) // between two looks at the lease
	}
}

// contend has a Locker other than s's wait for key, and use it once it
// has it.
func (r *nemesisRun) contend(s *nemesisSlot, key string, rnd *rand.Rand) {
	o := r.other(s, rnd)
	holder, l, stop := o.holder, o.locker, o.stop
	crnd := rand.New(rand.NewSource(rnd.Int63()))
	client := 600 + o.index
	o.workers.Go(func() {
		if lease, nl := r.claim(client, holder, l, l, key, between(crnd, 1500*time.Millisecond, 3500*time.Millisecond), true); lease != nil {
			r.hold(client, o, lease, nl, crnd, stop)
		}
	})
}

// other is a Locker slot other than s, at random.
func (r *nemesisRun) other(s *nemesisSlot, rnd *rand.Rand) *nemesisSlot {
	o := r.slots[rnd.Intn(nemesisLockers)]
	if o == s {
		o = r.slots[(s.index+1)%nemesisLockers]
	}
	return o
}

// fault counts a fault of kind on target and notes it in the timeline;
// the function it returns notes its end.
func (r *nemesisRun) fault(kind, target string) (healed func()) {
	from := time.Now()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.faults[kind]++
	i := len(r.timeline)
	r.timeline = append(r.timeline, fmt.Sprintf("%s %s on %s", from.Format("15:04:05.000"), kind, target))
	return func() {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.timeline[i] += fmt.Sprintf(" until %s", time.Now().Format("15:04:05.000"))
	}
}

// restart restarts the server, fast or immediately (a crash: a release,
// committed asynchronously, may be lost), and waits until the admin pool
// reaches it again.
func (r *nemesisRun) restart(rnd *rand.Rand) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mode := pgserver.Fast
	if rnd.Intn(2) == 0 {
		mode = pgserver.Immediate
	}
	defer r.fault("restart "+string(mode), "the server")()
	call := time.Now()
	require.NoError(r.t, r.server.Restart(ctx, mode))
	ret := time.Now()
	if mode == pgserver.Immediate {
		for _, key := range r.keys() {
			r.rec.Add(900, lin.Input{Key: key, Kind: lin.Crash}, call, lin.Output{Outcome: lin.OK}, ret)
		}
	}
	require.Eventually(r.t, func() bool { return r.admin.Ping(ctx) == nil }, 30*time.Second, 10*time.Millisecond, "the server answers again")
}

// keys are every key of the run: the workers', the Electors', and the
// ones each Locker's aimed faults use alone (aimKey).
func (r *nemesisRun) keys() []string {
	var keys []string
	for i := range nemesisKeys {
		keys = append(keys, fmt.Sprintf("k%d", i))
	}
	keys = append(keys, nemesisLeader)
	for _, job := range nemesisTickJobs {
		keys = append(keys, job.key)
	}
	for i := range nemesisLockers {
		keys = append(keys, aimKey("reentrant", i), aimKey("giveback", i), aimKey("lateclaim", i))
	}
	return keys
}

// aimKey is the key an aimed fault of Locker i uses: no worker claims it,
// so that what the fault sets up is not undone by chance.
func aimKey(aim string, i int) string { return fmt.Sprintf("%s%d", aim, i) }

// operator revokes or force-expires key's lease, as `pglease release`
// does, and records the row it found and whether it changed it.
func (r *nemesisRun) operator(kind lin.Kind, key string) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	r.fault(kind.String(), key)()
	call := time.Now()
	var (
		rev pglease.Revocation
		err error
	)
	if kind == lin.Revoke {
		rev, err = adminOf(r.t, r.admin, pglease.WithTable(r.table)).Revoke(ctx, key)
	} else {
		rev, err = adminOf(r.t, r.admin, pglease.WithTable(r.table)).ForceExpire(ctx, key)
	}
	ret := time.Now()
	in := lin.Input{Key: key, Kind: kind}
	switch {
	case err == nil:
		r.rec.Add(201, in, call, lin.Output{Outcome: lin.Seen, Holder: rev.Row.Holder, Fence: rev.Row.Fence, Live: rev.Row.Live, Changed: rev.Changed}, ret)
		if kind == lin.ForceExpire && rev.Changed {
			r.exemptLeases(nemesisExemption{key: key, fence: rev.Row.Fence})
		}
	case errors.Is(err, pglease.ErrNotFound):
		r.rec.Add(201, in, call, lin.Output{Outcome: lin.NotFound}, ret)
	default:
		r.rec.AddOpen(201, in, call, lin.Output{Outcome: lin.Unknown})
		if kind == lin.ForceExpire {
			r.exemptLeases(nemesisExemption{key: key, before: ret})
		}
	}
}

func (r *nemesisRun) exemptLeases(e nemesisExemption) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.exempt = append(r.exempt, e)
}

// closeRace closes s's incarnation while claims of it are in flight, in a
// moment without faults, and checks that Close left no row of its holder
// behind; with again, a new incarnation takes its place.
func (r *nemesisRun) closeRace(s *nemesisSlot, rnd *rand.Rand, again bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// The workers finish what they are doing; then nothing of this
	// incarnation is on its way to the server any more.
	close(s.stop)
	s.workers.Wait()
	if s.nem != nil {
		s.nem.Heal()
		require.NoError(r.t, s.nem.Drain(ctx))
	}
	require.NoError(r.t, pgtest.WaitQuiet(ctx, r.admin, s.app))
	var since int64
	seq := pgx.Identifier{r.table + "_fence_seq"}.Sanitize()
	require.NoError(r.t, r.admin.QueryRow(ctx, fmt.Sprintf(lastFenceSQL, seq)).Scan(&since))

	// Claims kept in flight: the statements are held a little before
	// they are sent.
	slow := between(rnd, 5*time.Millisecond, 60*time.Millisecond)
	if s.nem != nil {
		s.nem.Slow(slow)
	} else {
		s.proxy.SetLatency(slow/2, 0, r.seed)
	}
	var racers sync.WaitGroup
	for i := range 2 + rnd.Intn(4) {
		client := 100 + 10*s.index + i
		crnd := rand.New(rand.NewSource(r.seed + int64(7919*s.index+i)))
		racers.Go(func() { r.race(s, client, crnd) })
	}
	time.Sleep(between(rnd, 0, 150*time.Millisecond)) // lets the racers' claims get on their way
	closeErr := func() error {
		if s.elector {
			return s.elecOn.Close(ctx) // closes the Elector first
		}
		return s.locker.Close(ctx)
	}()
	// At once: a claim Close overtook must not leave its row for later.
	rows, err := r.admin.Query(ctx, fmt.Sprintf(leftBehindSQL, pgx.Identifier{r.table}.Sanitize()), s.holder, since, nemesisMaxMinHold.Seconds())
	require.NoError(r.t, err)
	for rows.Next() {
		var (
			key   string
			fence int64
			life  float64
		)
		require.NoError(r.t, rows.Scan(&key, &fence, &life))
		if closeErr != nil && strings.Contains(closeErr.Error(), fmt.Sprintf("claim %q may have written a row", key)) {
			continue // Close named it: it lapses at its expiry
		}
		r.mu.Lock()
		r.leftovers = append(r.leftovers, fmt.Sprintf("%s: after %s's Close returned (%v), its row of fence %d is live for %.3fs from its claim, released by nobody; the Locker's last events of %s:\n\t%s",
			key, s.holder, closeErr, fence, life, key, strings.Join(s.recentOf(s.holder, key), "\n\t")))
		r.mu.Unlock()
	}
	require.NoError(r.t, rows.Err())
	racers.Wait()
	if s.nem != nil {
		s.nem.Slow(0)
	} else {
		s.proxy.SetLatency(0, 0, r.seed)
	}
	if again {
		r.start(s)
	}
}

// race claims (or, for an Elector, asks for leadership) again and again
// until the incarnation is closed, keeping what it gets: keys of the
// workers on the Locker's terms or a job's, or ticks of a job of ticks.
func (r *nemesisRun) race(s *nemesisSlot, client int, rnd *rand.Rand) {
	for range 100 {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		var err error
		if s.elector {
			if rnd.Intn(2) == 0 {
				err = s.elec.IsLeader(ctx)
			} else {
				_, err = s.elec.Campaign(ctx)
			}
		} else {
			var c claimer = s.locker
			i := rnd.Intn(4)
			key := r.key(rnd)
			switch {
			case i < len(s.jobs):
				c = s.jobs[i]
			case i == 3: // a claim of a job's tick
				j := rnd.Intn(len(s.ticks))
				c, key = s.ticks[j], nemesisTickJobs[j].key
			}
			call := time.Now()
			var lease *pglease.Lease
			lease, err = c.Claim(ctx, key)
			r.claimed(client, s.holder, key, call, time.Now(), lease, err, false)
		}
		cancel()
		if errors.Is(err, pglease.ErrClosed) {
			return
		}
	}
}

// byKey splits a history by key.
func byKey(ops []porcupine.Operation) map[string][]porcupine.Operation {
	out := map[string][]porcupine.Operation{}
	for _, op := range ops {
		key := op.Input.(lin.Input).Key
		out[key] = append(out[key], op)
	}
	return out
}

// check runs every check on the run's history and reports the figures.
func (r *nemesisRun) check(ran time.Duration) {
	t := r.t
	// The outcome of every guarded write, from the ledger.
	committed := map[string]bool{}
	var ledger []lin.LedgerRow
	for _, e := range pgtest.ReadLedgerTokens(t, r.admin, r.ledger) {
		committed[e.Token] = true
		ledger = append(ledger, lin.LedgerRow{Seq: e.ID, Key: e.Key, Fence: e.Fence, Token: e.Token})
	}
	var careless []string
	for _, w := range r.writes {
		in := lin.Input{Key: w.key, Kind: lin.Write, Holder: w.holder, Fence: w.fence}
		switch {
		case committed[w.token] && w.committed:
			r.rec.Add(w.client, in, w.call, lin.Output{Outcome: lin.Committed}, w.ret)
		case committed[w.token]:
			r.rec.AddOpen(w.client, in, w.call, lin.Output{Outcome: lin.Committed}) // landed after its caller gave up
		default:
			r.rec.Add(w.client, in, w.call, lin.Output{Outcome: lin.Refused}, w.ret)
		}
		if committed[w.token] && errors.Is(w.guardErr, pglease.ErrLost) {
			careless = append(careless, fmt.Sprintf("%s: the commit of %s (fence %d) landed after Guard returned %v", w.key, w.holder, w.fence, w.guardErr))
		}
	}

	ops := r.rec.Operations()
	kept, pruned := lin.Prune(ops)
	started := time.Now()
	verdict, info := lin.Check(sqlstmt.RevokedHolder, kept, *nemesisCheckIn)
	took := time.Since(started)
	var linearizability []string
	switch verdict {
	case porcupine.Illegal:
		parts := byKey(kept)
		keys := make([]string, 0, len(parts))
		for key := range parts {
			keys = append(keys, key)
		}
		sort.Strings(keys)
		for _, key := range keys {
			if res, _ := lin.Check(sqlstmt.RevokedHolder, parts[key], *nemesisCheckIn); res == porcupine.Illegal {
				linearizability = append(linearizability, fmt.Sprintf("the history of %s is not linearizable", key))
			}
		}
		f, err := os.CreateTemp("", fmt.Sprintf("pglease-nemesis-%d-*.html", r.seed))
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, lin.Visualize(sqlstmt.RevokedHolder, info, f.Name()))
		linearizability = append(linearizability, fmt.Sprintf("the history is not linearizable; see %s", f.Name()))
	case porcupine.Unknown:
		t.Logf("porcupine did not finish within %v: no verdict on linearizability", *nemesisCheckIn)
	}

	// The runs of each tick of the jobs of ticks: porcupine on the same
	// history, and the ledger of runs.
	started = time.Now()
	tickVerdict, tickInfo := lin.CheckTicks(kept, *nemesisCheckIn)
	tickTook := time.Since(started)
	var tickRuns []string
	switch tickVerdict {
	case porcupine.Illegal:
		for _, at := range lin.IllegalTicks(kept, *nemesisCheckIn) {
			tickRuns = append(tickRuns, fmt.Sprintf("the runs of tick %s are not legal", at))
		}
		f, err := os.CreateTemp("", fmt.Sprintf("pglease-nemesis-ticks-%d-*.html", r.seed))
		require.NoError(t, err)
		require.NoError(t, f.Close())
		require.NoError(t, lin.VisualizeTicks(tickInfo, f.Name()))
		tickRuns = append(tickRuns, fmt.Sprintf("the runs of ticks are not legal; see %s", f.Name()))
	case porcupine.Unknown:
		t.Logf("porcupine did not finish within %v: no verdict on the runs of ticks", *nemesisCheckIn)
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	runs, err := adminOf(t, r.admin, pglease.WithTable(r.table)).Runs(ctx, "", ran+time.Hour)
	require.NoError(t, err)
	ledgerRuns := make([]lin.Run, 0, len(runs))
	for _, run := range runs {
		ledgerRuns = append(ledgerRuns, lin.Run{Key: run.Key, Tick: run.Tick, Fence: run.Fence, Outcome: run.Outcome})
	}
	ticks := lin.CountTicks(kept)

	leases := make([]lin.Lease, 0, len(r.leases))
	for _, nl := range r.leases {
		nl.mu.Lock()
		l := lin.Lease{Key: nl.key, Holder: nl.holder, Fence: nl.fence, Returned: nl.returned, LastTrusted: nl.trusted}
		nl.mu.Unlock()
		for _, e := range r.exempt {
			if e.key == l.Key && (e.fence == l.Fence || e.fence == 0 && l.Returned.Before(e.before)) {
				l.Exempt = true
			}
		}
		leases = append(leases, l)
	}
	checks := []struct {
		name     string
		problems []string
	}{
		{"porcupine", linearizability},
		{"fences", lin.FencesGrow(r.grants)},
		{"overlaps", lin.Overlaps(leases, r.takeovers)},
		{"ledger", lin.LedgerOrder(ledger)},
		{"careless commits", careless},
		{"left behind at Close", r.leftovers},
		{"unconfirmed claims", lin.ConfirmedGrants(r.grants, r.outages)},
		{"runs of ticks", tickRuns},
		{"ticks completed twice in the ledger", lin.CompletedOnce(ledgerRuns)},
	}
	var violations []string
	for _, c := range checks {
		violations = append(violations, fmt.Sprintf("%s %d", c.name, len(c.problems)))
		for i, p := range c.problems {
			if i == 10 {
				t.Errorf("%s: %d more", c.name, len(c.problems)-10)
				break
			}
			t.Errorf("%s: %s", c.name, p)
		}
	}
	injected := map[string]int{}
	for _, s := range r.slots {
		if s.nem != nil {
			for k, v := range s.nem.Counts() {
				injected[k] += v
			}
		}
	}
	trusted := 0
	for _, l := range leases {
		if !l.LastTrusted.IsZero() {
			trusted++
		}
	}
	t.Logf("figures: nemesis seed %d, %v, %d Lockers x %d workers and %d jobs of ticks and %d Electors on %d keys: %d operations %v; faults %v, statements faulted %v, at most %d commits at once waiting for an unanswered synchronous standby; "+
		"%d leases (%d seen trusted), %d takeovers, %d guarded writes (%d committed); porcupine %s on %d operations (%d of unknown outcome pruned) in %v; "+
		"ticks: %d runs of %d ticks, %d completed, %d caught up, %d runs in the ledger; porcupine on ticks %s in %v; violations: %s",
		r.seed, ran.Round(time.Second), nemesisLockers, nemesisWorkers, len(nemesisTickJobs), nemesisElectors, nemesisKeys, len(ops), lin.Count(ops), r.faults, injected, r.syncWaits,
		len(leases), trusted, len(r.takeovers), len(r.writes), len(committed), verdict, len(kept), pruned, took.Round(time.Millisecond),
		ticks.Runs, ticks.Ticks, ticks.Completions, ticks.CatchUps, len(runs), tickVerdict, tickTook.Round(time.Millisecond), strings.Join(violations, ", "))
}
