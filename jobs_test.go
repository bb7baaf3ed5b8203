package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// rowTimes is what the server says of a row's times now: its acquired_at,
// its expires_at, and how long it has left on the server's clock. It reads
// no fence, so it works on a table without one.
type rowTimes struct {
	acquiredAt, expiresAt time.Time
	left                  time.Duration
}

func readTimes(t *testing.T, db pglease.DB, table, key string) rowTimes {
	t.Helper()
	var (
		r    rowTimes
		left float64
	)
	err := db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT acquired_at, expires_at, extract(epoch FROM expires_at - clock_timestamp())::float8 FROM %s WHERE key = $1`,
			pgx.Identifier{table}.Sanitize()), key).Scan(&r.acquiredAt, &r.expiresAt, &left)
	require.NoError(t, err, "row of %q", key)
	r.left = time.Duration(left * float64(time.Second))
	return r
}

// waitRounds waits for n heartbeat rounds that each extended want leases.
func waitRounds(t *testing.T, events *pgtest.Events, n, want int) {
	t.Helper()
	for got := 0; got < n; {
		if ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second); ev.Leases == want {
			got++
		}
	}
}

// tickedJob is a job of jobsOnTheirOwnTerms: its name, period, the ticks
// counted and its JobLocker's terms.
type tickedJob struct {
	name   string
	period time.Duration
	ticks  int
	opts   []pglease.Option
}

// jobsOnTheirOwnTerms runs jobs on three replicas whose timers fire 0, 50
// and 100 ms apart, each job through a JobLocker of its terms, until every
// job got past its last tick counted, and returns the runs of each tick of
// each job; each run must have had its lease. slowest is the longest a
// claim of theirs took, latest the latest a run started after its
// replica's instant (its timer's lateness and its claim).
func jobsOnTheirOwnTerms(t *testing.T, table string, jobs []tickedJob) (perTick map[string]map[int]int, slowest, latest time.Duration) {
	t.Helper()
	type started struct {
		job string
		run run
	}
	var (
		mu        sync.Mutex
		runs      = map[string][]run{}
		scheds    []gocron.Scheduler
		shutdowns []func()
		// slowestClaim is the longest a claim took, latestStart the
		// latest a run started after its instant (guarded by mu).
		slowestClaim, latestStart time.Duration
	)
	starts := make(chan started, 1000)
	skews := []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond}
	lockers := make([]*pglease.Locker, len(skews))
	for i := range lockers {
		lockers[i] = pgtest.Locker(t, pgtest.Pool(t, nil), table, fmt.Sprintf("replica-%d", i+1), pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventAcquired || e.Kind == pglease.EventContended {
					mu.Lock()
					slowestClaim = max(slowestClaim, e.Took)
					mu.Unlock()
				}
			}))
		// A replica that has run before: its connection open and its
		// table checked, which its first tick would otherwise wait for.
		warm, err := lockers[i].Claim(t.Context(), fmt.Sprintf("warm-%d", i))
		require.NoError(t, err)
		require.NoError(t, warm.Unlock(t.Context()))
	}
	base := time.Now().Add(500 * time.Millisecond)
	for i, skew := range skews {
		name, l := fmt.Sprintf("replica-%d", i+1), lockers[i]
		sched, err := gocron.NewScheduler()
		require.NoError(t, err)
		shutdown := sync.OnceFunc(func() { _ = sched.Shutdown() })
		t.Cleanup(shutdown) // before the Locker's Close
		shutdowns = append(shutdowns, shutdown)
		for _, j := range jobs {
			_, err := sched.NewJob(gocron.DurationJob(j.period), gocron.NewTask(func() {
				x := run{replica: name, start: time.Now()}
				if lease, ok := l.Held(j.name); ok {
					x.fence = lease.Fence()
				}
				since := x.start.Sub(base.Add(skew))
				mu.Lock()
				latestStart = max(latestStart, since-since.Truncate(j.period))
				runs[j.name] = append(runs[j.name], x)
				mu.Unlock()
				starts <- started{j.name, x}
				time.Sleep(5 * time.Millisecond) // a short job: it releases long before the other replicas' timers fire
			}), gocron.WithName(j.name), gocron.WithStartAt(gocron.WithStartDateTime(base.Add(skew))),
				gocron.WithDistributedJobLocker(mustJob(t, l, j.opts...)))
			require.NoError(t, err)
		}
		scheds = append(scheds, sched)
	}
	defer func() { // the next run's replicas start on schedulers of their own
		for _, shutdown := range shutdowns {
			shutdown()
		}
	}()
	for _, sched := range scheds {
		sched.Start()
	}
	// Tick k of a job holds the timers fired at base + k*period + skew.
	tickOf := func(j tickedJob, at time.Time) int { return int(at.Sub(base.Add(-50*time.Millisecond)) / j.period) }
	past := map[string]bool{}
	limit := time.After(10 * time.Second)
	for len(past) < len(jobs) {
		select {
		case s := <-starts:
			for _, j := range jobs {
				if j.name == s.job && tickOf(j, s.run.start) > j.ticks {
					past[j.name] = true
				}
			}
		case <-limit:
			t.Fatalf("the jobs did not get past their last tick: %v", past)
		}
	}
	mu.Lock()
	defer mu.Unlock()
	perTick = map[string]map[int]int{}
	for _, j := range jobs {
		perTick[j.name] = map[int]int{}
		for _, x := range runs[j.name] {
			assert.Positive(t, x.fence, "%s ran with its lease", j.name)
			perTick[j.name][tickOf(j, x.start)]++
		}
		for _, x := range runs[j.name] { // what judges a tick run twice
			if k := tickOf(j, x.start); perTick[j.name][k] > 1 {
				t.Logf("%s tick %d: %s ran at base%+v with fence %d", j.name, k, x.replica, x.start.Sub(base), x.fence)
			}
		}
	}
	return perTick, slowestClaim, latestStart
}

func mustJob(t *testing.T, l *pglease.Locker, opts ...pglease.Option) *pglease.JobLocker {
	t.Helper()
	j, err := l.Job(opts...)
	require.NoError(t, err)
	return j
}

// TestJobs pins the leases of gocron jobs with their own terms: each job's
// TTL and min hold hold for its lease alone, in claims, heartbeats,
// releases and trust, with or without the fence column.
func TestJobs(t *testing.T) {
	t.Parallel()
	// Assumption: gocron calls the JobLocker given to WithDistributedJobLocker
	// with the job's name, and replicas' timers fire within the min hold of
	// each other (100 ms here, and 200 ms to spare for a timer late on a busy
	// machine). The Locker's own min hold is 0: exactly once comes from each
	// job's own min hold alone.
	t.Run("EachTickOnceOnItsOwnTerms", func(t *testing.T) {
		t.Parallel()
		table := pgtest.Table(t, pgtest.Pool(t, nil))
		// Its margins are 200 ms: a run during which the test process
		// stalled, a claim took, or a job started after its replica's
		// instant, longer than maxStall judges nothing, and runs again on
		// new keys and new replicas, three times at most. A second run of
		// a tick that the min hold failed to prevent starts within the
		// replicas' skew of its instant, and is judged.
		const maxStall = 150 * time.Millisecond
		for attempt := 1; ; attempt++ {
			watch := pgtest.WatchStalls(t)
			jobs := []tickedJob{
				{fmt.Sprintf("every-half-second-%d", attempt), 500 * time.Millisecond, 6, []pglease.Option{pglease.WithTTL(time.Second), pglease.WithMinHold(300 * time.Millisecond)}},
				{fmt.Sprintf("every-second-%d", attempt), time.Second, 3, []pglease.Option{pglease.WithTTL(time.Minute), pglease.WithMinHold(500 * time.Millisecond)}},
			}
			perTick, slowest, latest := jobsOnTheirOwnTerms(t, table, jobs)
			stall := watch.Stop()
			if stall >= maxStall || slowest >= maxStall || latest >= maxStall {
				require.Less(t, attempt, 3, "three runs stalled, had a claim or a job's start later than %v (the last %v, %v, %v)", maxStall, stall, slowest, latest)
				t.Logf("run %d stalled %v, a claim took %v, a job started %v after its instant: one is longer than %v: again", attempt, stall, slowest, latest, maxStall)
				continue
			}
			t.Logf("longest stall %v, slowest claim %v, latest start %v", stall, slowest, latest)
			for _, j := range jobs {
				for k := range j.ticks {
					assert.Equal(t, 1, perTick[j.name][k], "%s tick %d runs exactly once", j.name, k)
				}
				t.Logf("%s: runs per tick %v", j.name, perTick[j.name])
			}
			return
		}
	})

	// Guarantee: one heartbeat statement per round extends each lease by its own
	// TTL.
	t.Run("OneHeartbeatStatementExtendsEachByItsTTL", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		short := mustJob(t, l, pglease.WithTTL(time.Second))
		long := mustJob(t, l, pglease.WithTTL(time.Minute))

		_, err := l.Claim(ctx, "locker")
		require.NoError(t, err)
		_, err = short.Claim(ctx, "short")
		require.NoError(t, err)
		longLease, err := long.Claim(ctx, "long")
		require.NoError(t, err)
		claimedExpiry := longLease.ExpiresAt()
		counter.Reset()

		waitRounds(t, events, 3, 3)
		// Each row has at most its own TTL left, and at least its TTL less two
		// heartbeat intervals and a generous allowance for a loaded machine.
		for _, c := range []struct {
			key string
			ttl time.Duration
		}{{"locker", 3 * time.Second}, {"short", time.Second}, {"long", time.Minute}} {
			left := readTimes(t, pool, table, c.key).left
			assert.LessOrEqual(t, left, c.ttl, "%s is extended by its own TTL, no further", c.key)
			assert.Greater(t, left, c.ttl-700*time.Millisecond, "%s is extended by its own TTL", c.key)
		}
		assert.True(t, readTimes(t, pool, table, "long").expiresAt.After(claimedExpiry), "the long lease moved by its own TTL")

		require.NoError(t, l.Close(ctx)) // no round after it
		rounds := events.Count(pglease.EventExtended) + events.Count(pglease.EventHeartbeatFailed)
		beats := counter.Count("heartbeat")
		assert.GreaterOrEqual(t, beats, 3)
		// One statement per round, whatever the TTLs; Close may cut off the
		// report of the last round in flight.
		assert.LessOrEqual(t, beats, rounds+1, "heartbeat statements %d for %d rounds", beats, rounds)
	})

	// Guarantee: a release keeps each job's lease for its own min hold, in one
	// statement.
	t.Run("ReleaseKeepsEachMinHoldInOneStatement", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(10*time.Second)) // min hold 0
		holds := map[string]time.Duration{"locker": 0, "two": 2 * time.Second, "five": 5 * time.Second}
		var leases []*pglease.Lease
		for _, key := range []string{"locker", "two", "five"} {
			claim := l.Claim
			if holds[key] > 0 {
				claim = mustJob(t, l, pglease.WithMinHold(holds[key]), pglease.WithTTL(20*time.Second)).Claim
			}
			lease, err := claim(ctx, key)
			require.NoError(t, err)
			leases = append(leases, lease)
		}
		counter.Reset()
		for _, err := range pglease.UnlockBurst(ctx, l, leases) {
			require.NoError(t, err)
		}
		assert.Equal(t, 1, counter.Count("release"), "one release statement for leases of three min holds")
		for _, key := range []string{"two", "five"} {
			row := readTimes(t, pool, table, key)
			assert.Equal(t, holds[key], row.expiresAt.Sub(row.acquiredAt), "%s is kept for its own min hold after its claim", key)
		}
		row, _ := pgtest.ReadRow(t, pool, table, "locker")
		assert.False(t, row.Live, "the Locker's lease, without min hold, is free at once")

		// Alone, as gocron's Unlock sends it, the job's min hold holds too.
		j := mustJob(t, l, pglease.WithMinHold(3*time.Second))
		lease, err := j.Claim(ctx, "alone")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		alone := readTimes(t, pool, table, "alone")
		assert.Equal(t, 3*time.Second, alone.expiresAt.Sub(alone.acquiredAt))
		other := pgtest.Locker(t, pool, table, "replica-2")
		_, err = other.Claim(ctx, "alone")
		require.ErrorIs(t, err, pglease.ErrHeld, "no other replica runs the same tick within the min hold")
	})

	// Guarantee: a job's terms that cannot work are refused, naming them, and
	// nothing is written.
	t.Run("RefusesTermsThatCannotWork", func(t *testing.T) {
		t.Parallel()
		counter := &pgtest.Statements{}
		pool := pgtest.Pool(t, counter)
		table := pgtest.Table(t, pool)
		counter.Reset()
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		held := pgtest.Locker(t, pool, table, "replica-2", pglease.WithTTL(5*time.Second), pglease.WithMinHold(2*time.Second))
		for _, c := range []struct {
			locker *pglease.Locker
			opts   []pglease.Option
			want   []string
		}{
			{l, []pglease.Option{{}}, []string{"the zero Option"}},
			{l, []pglease.Option{pglease.WithHolder("job")}, []string{"WithHolder does not apply to Locker.Job", "give it to NewLocker"}},
			{l, []pglease.Option{pglease.WithTTL(time.Millisecond)}, []string{"WithTTL(1ms)", "at least 10ms"}},
			{l, []pglease.Option{pglease.WithTimeout(0)}, []string{"WithTimeout(0s)"}},
			{l, []pglease.Option{pglease.WithMinHold(-time.Second)}, []string{"WithMinHold(-1s)"}},
			{l, []pglease.Option{pglease.WithTTL(400 * time.Millisecond)}, []string{"WithTTL(400ms)", "heartbeat interval (200ms)", "TTL/2"}},
			{l, []pglease.Option{pglease.WithTTL(time.Second), pglease.WithMinHold(2 * time.Second)}, []string{"WithMinHold(2s)", "job's TTL (1s)"}},
			{held, []pglease.Option{pglease.WithTTL(time.Second)}, []string{"the Locker's WithMinHold(2s)", "job's TTL (1s)"}},
		} {
			j, err := c.locker.Job(c.opts...)
			require.ErrorIs(t, err, pglease.ErrInvalidOption)
			assert.Nil(t, j)
			for _, want := range c.want {
				assert.Contains(t, err.Error(), want)
			}
		}
		// The rule is the same as NewLocker's: just over twice the interval is fine.
		j, err := l.Job(pglease.WithTTL(401*time.Millisecond), pglease.WithMinHold(401*time.Millisecond), pglease.WithTimeout(time.Second))
		require.NoError(t, err)
		assert.Equal(t, 401*time.Millisecond, j.TTL())
		assert.Equal(t, 401*time.Millisecond, j.MinHold())
		assert.Zero(t, counter.Count("claim")+counter.Count("heartbeat")+counter.Count("release")+counter.Count("other"), "Job sends nothing")
	})

	// Guarantee: without the fence column, job leases are extended and held by
	// their own terms.
	t.Run("WithoutFenceColumnKeepTheirOwnTerms", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn(), pglease.WithTTL(3*time.Second),
			pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		short := mustJob(t, l, pglease.WithTTL(time.Second), pglease.WithMinHold(500*time.Millisecond))
		long := mustJob(t, l, pglease.WithTTL(time.Minute), pglease.WithMinHold(2*time.Second))
		shortLease, err := short.Claim(ctx, "short")
		require.NoError(t, err)
		longLease, err := long.Claim(ctx, "long")
		require.NoError(t, err)
		claimedExpiry := longLease.ExpiresAt()

		waitRounds(t, events, 3, 2)
		left := readTimes(t, pool, table, "short").left
		assert.LessOrEqual(t, left, time.Second)
		assert.Greater(t, left, 300*time.Millisecond)
		assert.True(t, readTimes(t, pool, table, "long").expiresAt.After(claimedExpiry), "the long lease moved by its own TTL")
		assert.Greater(t, readTimes(t, pool, table, "long").left, 59*time.Second)

		// A release after a lease's min hold (a loaded machine's rounds
		// took that long) expires it at the release's own instant, which
		// falls between the server's now() before and after it: a row
		// whose hold may have ended by then expires at its hold's end or
		// at that instant, whichever is later.
		var before, after time.Time
		require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&before))
		require.NoError(t, pglease.UnlockBurst(ctx, l, []*pglease.Lease{shortLease, longLease})[0])
		require.NoError(t, pool.QueryRow(ctx, `SELECT now()`).Scan(&after))
		for key, hold := range map[string]time.Duration{"short": 500 * time.Millisecond, "long": 2 * time.Second} {
			row := readTimes(t, pool, table, key)
			if held := row.acquiredAt.Add(hold); held.Before(after) {
				t.Logf("%s may have been released after its min hold of %v", key, hold)
				from := held
				if before.After(from) {
					from = before
				}
				assert.False(t, row.expiresAt.Before(from) || row.expiresAt.After(after), "%s expired at %v, neither at its hold's end nor at its release (between %v and %v)", key, row.expiresAt, from, after)
				continue
			}
			assert.Equal(t, hold, row.expiresAt.Sub(row.acquiredAt), "%s is kept for its own min hold", key)
		}
	})

	// Guarantee: a coalesced burst of claims with mixed TTLs gives each row its
	// own TTL.
	t.Run("BurstGivesEachRowItsOwnTTL", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, counter := pgtest.SetupCounted(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
		ttls := []time.Duration{time.Second, 5 * time.Second, 30 * time.Second, 2 * time.Minute, 1500 * time.Millisecond}
		keys := make([]string, len(ttls))
		jobs := make([]*pglease.JobLocker, len(ttls))
		for i, ttl := range ttls {
			keys[i], jobs[i] = fmt.Sprintf("job-%d", i), mustJob(t, l, pglease.WithTTL(ttl))
		}
		counter.Reset()
		leases, errs := pglease.ClaimBurstOfJobs(ctx, l, jobs, keys)
		assert.Equal(t, 1, counter.Count("claim"), "the claims of five TTLs go in one statement")
		for i, key := range keys {
			require.NoError(t, errs[i], key)
			row := readTimes(t, pool, table, key)
			assert.Equal(t, ttls[i], row.expiresAt.Sub(row.acquiredAt), "%s has its own TTL", key)
			assert.Equal(t, row.expiresAt, leases[i].ExpiresAt())
		}
	})

	// Assumption: the trust window of a lease counts its own TTL. A job's
	// 1-second lease on a Locker of 1-minute leases must stop being trusted
	// within about a second of its last heartbeat, not a minute: the server
	// lets another replica in after one second.
	t.Run("TrustedOnlyForTheirOwnTTL", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		l := pgtest.Locker(t, db, table, "replica-1", pglease.WithTTL(time.Minute), pglease.WithHeartbeatInterval(100*time.Millisecond))
		own, err := l.Claim(ctx, "locker")
		require.NoError(t, err)
		lease, err := mustJob(t, l, pglease.WithTTL(time.Second)).Claim(ctx, "short")
		require.NoError(t, err)

		db.SetFail("heartbeat", errors.New("network down"))
		pgtest.WaitDone(t, lease, 5*time.Second) // trusted for the Locker's TTL, it would last ~54s
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.NoError(t, own.Err(), "the Locker's own lease keeps its own, longer, trust window")
	})
}

// TestJobsLeaveNoGoroutineAfterClose: the Locker's Close releases the
// leases of its jobs, reports them, and leaves no goroutine behind.
//
// Not parallel, and so no subtest of TestJobs: the goroutines of the other
// tests, paused until the sequential ones end, are there before and after
// and are ignored; only what this test started is looked for.
func TestJobsLeaveNoGoroutineAfterClose(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	ctx := pgtest.Ctx(t)
	pool, err := pgxpool.New(ctx, pgtest.Server.DSN())
	require.NoError(t, err)
	defer pool.Close()
	table := pgtest.Table(t, pool)
	events := pgtest.NewEvents(t)
	l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("replica-1"), pglease.WithLogger(pgtest.Quiet),
		pglease.WithHook(events.Hook), pglease.WithHeartbeatInterval(100*time.Millisecond)))
	quick := mustJob(t, l, pglease.WithTTL(time.Second))
	held := mustJob(t, l, pglease.WithTTL(time.Second), pglease.WithMinHold(time.Second))
	quickLease, err := quick.Claim(ctx, "quick")
	require.NoError(t, err)
	heldLease, err := held.Claim(ctx, "held")
	require.NoError(t, err)
	got, ok := l.Held("quick")
	require.True(t, ok, "Held finds a job's lease")
	require.Same(t, quickLease, got)

	// Guard works on a job's lease.
	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, heldLease.Guard(ctx, tx))
	require.NoError(t, tx.Rollback(ctx))
	waitRounds(t, events, 1, 2)

	require.NoError(t, l.Close(ctx))
	for _, lease := range []*pglease.Lease{quickLease, heldLease} {
		pgtest.WaitDone(t, lease, time.Second)
		require.ErrorIs(t, lease.Err(), pglease.ErrClosed)
	}
	row, _ := pgtest.ReadRow(t, pool, table, "quick")
	assert.False(t, row.Live, "released by Close")
	kept := readTimes(t, pool, table, "held")
	assert.Equal(t, time.Second, kept.expiresAt.Sub(kept.acquiredAt), "Close keeps the job's min hold")
	assert.Equal(t, 2, events.Count(pglease.EventReleased), "the Locker's hooks report the job leases' release")
	_, err = quick.Claim(ctx, "quick")
	require.ErrorIs(t, err, pglease.ErrClosed)
}

// TestTask: a gocron job named once by Locker.Task runs with its lease,
// and a job left with gocron's default name is reported.
func TestTask(t *testing.T) {
	t.Parallel()

	// The name given once is the job's gocron name and its lease's key;
	// the run works under a context that ends with the lease.
	t.Run("NamesTheJobOnceAndHandsItsLease", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		type seen struct {
			key    string
			fence  int64
			live   bool
			runCtx context.Context
			onHeld bool
		}
		ran := make(chan seen, 1)
		task, named := l.Task("nightly-report", func(ctx context.Context, lease *pglease.Lease) error {
			held, ok := l.Held("nightly-report")
			ran <- seen{key: lease.Key(), fence: lease.Fence(), live: ctx.Err() == nil, runCtx: ctx, onHeld: ok && held == lease}
			return nil
		})
		j, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, named)
		require.NoError(t, err)
		assert.Equal(t, "nightly-report", j.Name())
		var got seen
		select {
		case got = <-ran:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not run within 10s")
		}
		assert.Equal(t, "nightly-report", got.key)
		assert.Positive(t, got.fence)
		assert.True(t, got.live, "the run's context is live while the lease is held")
		assert.True(t, got.onHeld, "the lease handed to the run is the one Held finds")
		select {
		case <-got.runCtx.Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the run's context outlived the run")
		}
		assert.Zero(t, events.Count(pglease.EventUnnamedJob))
	})

	// The run's context ends the moment the lease is lost, with the loss
	// as its cause; a JobLocker's terms apply to the lease.
	t.Run("RunEndsWhenTheLeaseIsLost", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		job := mustJob(t, l, pglease.WithTTL(time.Minute))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		started, ended := make(chan *pglease.Lease, 1), make(chan error, 1)
		task, named := l.Task("long-run", func(ctx context.Context, lease *pglease.Lease) error {
			started <- lease
			<-ctx.Done()
			ended <- context.Cause(ctx)
			return nil
		})
		_, err := s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()), task, named, gocron.WithDistributedJobLocker(job))
		require.NoError(t, err)
		var lease *pglease.Lease
		select {
		case lease = <-started:
		case <-time.After(10 * time.Second):
			t.Fatal("the job did not start within 10s")
		}
		assert.Greater(t, lease.ExpiresAt().Sub(lease.AcquiredAt()), 30*time.Second, "claimed on the job's TTL")
		_, err = adminOf(t, pool, pglease.WithTable(table)).ForceExpire(ctx, "long-run")
		require.NoError(t, err)
		_, err = pgtest.Locker(t, pool, table, "replica-2").Claim(ctx, "long-run")
		require.NoError(t, err)
		select {
		case cause := <-ended:
			require.ErrorIs(t, cause, pglease.ErrLost)
		case <-time.After(10 * time.Second):
			t.Fatal("the run's context did not end within 10s of the loss")
		}
	})

	// A run that finds no lease under its name (the job renamed by a
	// WithName of its own, a lease lost before the run began) is skipped,
	// and reported once per job, however often it recurs: a job that never
	// runs is seen.
	t.Run("RunWithoutALeaseIsReportedOnce", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		var logs lockedBuffer
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook), pglease.WithLogger(jsonLogger(&logs)))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		ran := make(chan struct{}, 1)
		task, _ := l.Task("send-invoices", func(context.Context, *pglease.Lease) error { ran <- struct{}{}; return nil })
		_, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), task, gocron.WithName("send-invoice")) // the lease's key
		require.NoError(t, err)
		require.Eventually(t, func() bool { return events.Count(pglease.EventReleased) >= 3 }, 10*time.Second, 10*time.Millisecond,
			"three runs of the job, each claimed and released")
		select {
		case <-ran:
			t.Fatal("a run without its lease ran")
		default:
		}
		require.Equal(t, 1, events.Count(pglease.EventRunWithoutLease), "once per job, not per run")
		got := events.WaitFor(t, pglease.EventRunWithoutLease, time.Second)
		assert.Equal(t, "send-invoices", got.Key)
		assert.Contains(t, got.Err.Error(), "no lease")
		lines := loggedLines(t, &logs, pglease.EventRunWithoutLease)
		require.Len(t, lines, 1)
		assert.Equal(t, "WARN", lines[0]["level"])
	})

	t.Run("RefusesABadName", func(t *testing.T) {
		t.Parallel()
		l := pgtest.Each(pglease.NewLocker(pgtest.Pool(t, nil)))
		assert.Contains(t, panicMessage(func() { l.Task("", func(context.Context, *pglease.Lease) error { return nil }) }), "key is empty")
		assert.Contains(t, panicMessage(func() { l.Task("job", nil) }), "run is nil")
		require.NoError(t, l.Close(context.Background()))
	})

	// A job given no gocron.WithName gets the Go function's name, which
	// changes when the code moves: Lock reports it once, at error level,
	// however often the job runs, and the job still runs.
	t.Run("UnnamedJobIsReportedOnce", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		logged := &lockedBuffer{}
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logged, &slog.HandlerOptions{Level: slog.LevelInfo}))))
		s := scheduler(t, gocron.WithDistributedLocker(l))
		var runs atomic.Int32
		enough := make(chan struct{})
		_, err := s.NewJob(gocron.DurationJob(50*time.Millisecond), gocron.NewTask(func() {
			if runs.Add(1) == 3 {
				close(enough)
			}
		}))
		require.NoError(t, err)
		select {
		case <-enough:
		case <-time.After(10 * time.Second):
			t.Fatalf("the unnamed job ran %d times in 10s, not 3", runs.Load())
		}
		require.NoError(t, s.StopJobs())
		warned := events.WaitFor(t, pglease.EventUnnamedJob, time.Second)
		assert.Contains(t, warned.Key, "pglease_test.TestTask", "the key is the function's name")
		require.ErrorIs(t, warned.Err, pglease.ErrUnnamedJob)
		assert.Equal(t, 1, events.Count(pglease.EventUnnamedJob), "once per key")
		assert.Contains(t, logged.String(), "level=ERROR")
		assert.Contains(t, logged.String(), "unnamed_job")
	})

	// What is taken for a Go function's name, and what is not.
	t.Run("FunctionNamesAreTold", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithHook(events.Hook))
		for key, want := range map[string]bool{
			"main.main.func1":                    true,
			"main.report":                        true,
			"github.com/acme/billing.report":     true,
			"github.com/acme/billing.(*Job).Run": true,
			"github.com/acme/billing.Job.Run-fm": true,
			"svc.handler.func2.1":                true,
			"nightly-report":                     false,
			"billing.invoice":                    false,
			"send reminders":                     false,
			"reports/2024.csv":                   false,
			"v1.2.3":                             false,
		} {
			lock, err := l.Lock(ctx, key)
			require.NoError(t, err, key)
			require.NoError(t, lock.Unlock(ctx))
			warned := false
			for _, ev := range events.All() {
				warned = warned || ev.Kind == pglease.EventUnnamedJob && ev.Key == key
			}
			assert.Equal(t, want, warned, "%q taken for a function name", key)
		}
	})
}
