package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// holdTickEnv is the variable that makes the test binary a replica that
// claims a tick of the job "job" and runs it until it is killed: the
// database URL, the table and the period in nanoseconds, separated by
// spaces.
func holdTickEnv() string { return os.Getenv("PGLEASE_TEST_HOLD_TICK") }

// holdTick is that replica: it prints "held FENCE TICK" once its Lock
// returns, then runs forever. It exits 1 on any failure.
func holdTick() {
	var dsn, table string
	var period time.Duration
	if _, err := fmt.Sscan(holdTickEnv(), &dsn, &table, &period); err != nil {
		fmt.Println("bad", holdTickEnv(), err)
		os.Exit(1)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		fmt.Println("pool:", err)
		os.Exit(1)
	}
	l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("killed"), pglease.WithTTL(time.Second))
	j, err := l.Job(pglease.WithPeriod(period))
	if err != nil {
		fmt.Println("job:", err)
		os.Exit(1)
	}
	lock, err := j.Lock(ctx, "job")
	if err != nil {
		fmt.Println("lock:", err)
		os.Exit(1)
	}
	lease := lock.(*pglease.Lease)
	fmt.Printf("held %d %d\n", lease.Fence(), lease.Tick().UnixNano())
	select {} // the run, until SIGKILL
}

// killedMidRun starts a replica process that claims the current tick of
// "job" and kills it (SIGKILL) once its run has begun; it returns the run's
// fence and tick, and when it was killed.
func killedMidRun(t *testing.T, table string, period time.Duration) (int64, time.Time, time.Time) {
	t.Helper()
	cmd := exec.CommandContext(pgtest.Ctx(t), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), fmt.Sprintf("PGLEASE_TEST_HOLD_TICK=%s %s %d", pgtest.Server.DSN(), table, period))
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	cmd.Stderr = os.Stderr
	require.NoError(t, cmd.Start())
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	var fence, tick int64
	var word string
	_, err = fmt.Fscan(out, &word, &fence, &tick)
	require.NoError(t, err)
	require.Equal(t, "held", word)
	require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
	killed := time.Now()
	_ = cmd.Wait()
	return fence, time.Unix(0, tick), killed
}

// offsetClock is a replica's clock, off from the machine's by offset: what
// gocron reads to fire a job's ticks.
type offsetClock struct {
	clockwork.Clock
	offset time.Duration
}

func (c offsetClock) Now() time.Time                  { return time.Now().Add(c.offset) }
func (c offsetClock) Since(t time.Time) time.Duration { return c.Now().Sub(t) }
func (c offsetClock) Until(t time.Time) time.Duration { return t.Sub(c.Now()) }

// tickRun is one run of a job of ticks, as its task saw it.
type tickRun struct {
	replica    string
	tick       time.Time
	fence      int64
	start, end time.Time
	lostAtEnd  error
}

// TestTicks pins the claims of a job's ticks (WithPeriod): each tick of a
// job runs at most once, judged on the server's clock, whatever the
// replicas' clocks, the job's duration and the replicas' restarts.
func TestTicks(t *testing.T) {
	t.Parallel()

	// Guarantee: three replicas whose clocks are up to 0.4 of the period
	// apart, no min hold: every tick of a job runs at most once; a job that
	// returns at once runs every tick exactly once; a job that takes 1.5
	// periods keeps its lease through its run, and a tick it skips is one
	// a run of an earlier tick held the key through.
	t.Run("EachTickAtMostOnceAcrossOffsetClocks", func(t *testing.T) {
		t.Parallel()
		table := pgtest.Table(t, pgtest.Pool(t, nil))
		eachTickAtMostOnceAcrossOffsetClocks(t, 20, func() pglease.DB { return pgtest.Pool(t, nil) }, table)
	})

	// Guarantee: a tick once claimed is never claimed again, by a replica
	// restarted within the period (a new Locker, a new holder) nor by the
	// one that ran it, though its run ended and released the key; the next
	// tick is claimed with a greater fence.
	t.Run("ATickRunIsNeverClaimedAgain", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period = 3 * time.Second
		a := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(period))
		// Far from a tick's edge: the claims below see the same tick.
		time.Sleep(time.Until(time.Now().Truncate(period).Add(period + 100*time.Millisecond)))
		first, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, first.Unlock(ctx))

		restarted := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(period))
		_, err = restarted.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld, "a restarted replica claimed the tick run")
		require.ErrorContains(t, err, "already taken")
		_, err = a.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld, "the replica that ran the tick claimed it again")

		time.Sleep(time.Until(first.Tick().Add(period)))
		next, err := restarted.Claim(ctx, "k")
		require.NoError(t, err)
		assert.Equal(t, first.Tick().Add(period), next.Tick())
		assert.Greater(t, next.Fence(), first.Fence())
		require.NoError(t, next.Unlock(ctx))
	})

	// Guarantee: the tick is the instant of the grid nearest the server's
	// clock at the claim, whatever the claimer's clock says.
	t.Run("IsTheOneNearestTheServersClock", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period = time.Hour
		j := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(period))
		var before, after time.Time
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before))
		lease, err := j.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&after))
		// Both readings round to the same hour but at the half hour,
		// when either is right.
		assert.True(t, lease.Tick().Equal(before.Round(period)) || lease.Tick().Equal(after.Round(period)),
			"tick %v, server clock from %v to %v", lease.Tick(), before, after)
		var stored time.Time
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT tick FROM %q WHERE key = 'k'", table)).Scan(&stored))
		assert.True(t, stored.Equal(lease.Tick()), "the row keeps the tick: %v", stored)
		require.NoError(t, lease.Unlock(ctx))
	})

	// Guarantee: a run that outlasts its period keeps its lease, and the
	// claim of the next tick, by its own Locker or another, is ErrHeld and
	// says that the earlier tick's run holds the key. The ledger enters
	// that tick once as skipped, however many claims found it so, and
	// lists it as the run alone if a replica claims it after the earlier
	// run ends (a later clock).
	t.Run("ARunThatOutlastsItsPeriodSkipsTheNextTick", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period = time.Second
		evA, evB := pgtest.NewEvents(t), pgtest.NewEvents(t)
		la, lb := pgtest.Locker(t, pool, table, "a", pglease.WithHook(evA.Hook)), pgtest.Locker(t, pool, table, "b", pglease.WithHook(evB.Hook))
		a, b := mustJob(t, la, pglease.WithPeriod(period)), mustJob(t, lb, pglease.WithPeriod(period))
		lock, err := a.Lock(ctx, "k")
		require.NoError(t, err)
		held, ok := la.Held("k")
		require.True(t, ok)
		time.Sleep(time.Until(held.Tick().Add(period)))
		for name, j := range map[string]*pglease.JobLocker{"its own Locker": a, "another": b} {
			_, err := j.Lock(ctx, "k")
			require.ErrorIs(t, err, pglease.ErrHeld, name)
			require.ErrorContains(t, err, "still holds the key", name)
		}
		require.NoError(t, held.Err(), "the run kept its lease")
		next := held.Tick().Add(period)
		// Each refusal is reported skipped, for the metrics of skipped ticks:
		// the other Locker's with the tick the server refused, its own
		// Locker's (refused before any statement) with none.
		for name, ev := range map[string]*pgtest.Events{"its own Locker": evA, "another": evB} {
			require.Equal(t, 1, ev.Count(pglease.EventContended), name)
			for _, e := range ev.All() {
				if e.Kind == pglease.EventContended {
					assert.True(t, e.Skipped, name)
					require.ErrorContains(t, e.Err, "still holds the key", name)
					assert.True(t, e.Tick.Equal(next) || ev == evA && e.Tick.IsZero(), "%s: the tick refused: %v", name, e.Tick)
				}
			}
		}
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		runs, err := admin.Runs(ctx, "k", time.Hour)
		require.NoError(t, err)
		require.Len(t, runs, 2, "%+v", runs)
		assert.Equal(t, []string{"running", "skipped"}, []string{runs[0].Outcome, runs[1].Outcome})
		assert.True(t, runs[1].Tick.Equal(next), "the tick skipped: %v", runs[1].Tick)
		assert.Equal(t, runs[0].Fence, runs[1].Fence, "under the fence of the run that held the key")
		var skips int
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT count(*) FROM %q WHERE outcome = 'skipped'", table+"_run")).Scan(&skips))
		assert.Equal(t, 1, skips, "one skipped row for the two claims")

		require.NoError(t, lock.Unlock(ctx))
		late, err := b.Claim(ctx, "k") // a replica whose clock fired late, within the tick's half period
		require.NoError(t, err)
		require.True(t, late.Tick().Equal(next), "the tick skipped by one replica, run by another: %v", late.Tick())
		require.NoError(t, late.Unlock(ctx))
		runs, err = admin.Runs(ctx, "k", time.Hour)
		require.NoError(t, err)
		assert.Equal(t, []string{"completed", "completed"}, []string{runs[0].Outcome, runs[1].Outcome}, "the skip is not listed beside the run of its tick: %+v", runs)
	})

	// Guarantee: each claim of a tick enters its run in the ledger, and the
	// next claim closes the run it took the row from with how it ended:
	// completed when released, lapsed when it expired without a release,
	// revoked; the run still holding the key reads as running.
	t.Run("TheLedgerRecordsEachRunAndHowItEnded", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period = 700 * time.Millisecond
		job := func(name string) *pglease.JobLocker {
			return mustJob(t, pgtest.Locker(t, pool, table, name, pglease.WithTTL(time.Second)), pglease.WithPeriod(period))
		}
		a, b := job("a"), job("b")
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		nextTick := func(after time.Time) { time.Sleep(time.Until(after.Add(period))) }

		// Each claim well inside its tick's half period: the server's
		// clock rounds to the tick the test means.
		time.Sleep(time.Until(time.Now().Truncate(period).Add(period + period/10)))
		completed, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, completed.Unlock(ctx))
		nextTick(completed.Tick())
		lapsed, err := b.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = admin.ForceExpire(ctx, "job") // expired without a release, as when its holder is killed
		require.NoError(t, err)
		nextTick(lapsed.Tick())
		revoked, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = admin.Revoke(ctx, "job")
		require.NoError(t, err)
		nextTick(revoked.Tick().Add(2 * period))   // a revoked lease lives out its TTL (1s)
		running, err := job("c").Claim(ctx, "job") // b may still trust its lease until its heartbeat
		require.NoError(t, err)

		runs, err := admin.Runs(ctx, "job", time.Hour)
		require.NoError(t, err)
		require.Len(t, runs, 4, "%+v", runs)
		for i, want := range []struct {
			lease   *pglease.Lease
			outcome string
		}{{completed, "completed"}, {lapsed, "lapsed"}, {revoked, "revoked"}, {running, "running"}} {
			r := runs[i]
			assert.Equal(t, want.outcome, r.Outcome, "run %d", i)
			assert.Equal(t, want.lease.Fence(), r.Fence, "run %d", i)
			assert.True(t, want.lease.Tick().Equal(r.Tick), "run %d: tick %v, the lease's %v", i, r.Tick, want.lease.Tick())
			assert.Equal(t, want.lease.Holder(), r.Holder, "run %d", i)
			assert.True(t, want.lease.AcquiredAt().Equal(r.StartedAt), "run %d starts at its claim", i)
			if want.outcome == "running" {
				assert.True(t, r.EndedAt.IsZero(), "a run in progress has no end")
			} else {
				assert.False(t, r.EndedAt.Before(r.StartedAt), "run %d ends after it starts: %+v", i, r)
			}
		}
		all, err := admin.Runs(ctx, "", time.Hour)
		require.NoError(t, err)
		assert.Len(t, all, 4, "every job's runs")
		none, err := admin.Runs(ctx, "another-job", time.Hour)
		require.NoError(t, err)
		assert.Empty(t, none)
		require.NoError(t, running.Unlock(ctx))
	})

	// Guarantee: with WithCatchUp, a tick whose run lapsed (its holder cut
	// off from the database, as a killed replica is;
	// AKilledRunIsLapsedAndCaughtUpOnlyWithCatchUp kills
	// one for real) is run once more by
	// exactly one of the replicas whose Lock found that run holding the
	// key, with a greater fence, before the next tick (within 1.5 s of the lapse); the others
	// skip it once that run is released. Without it, the tick is skipped at
	// once. The ledger shows the lapsed run and the one that caught up.
	t.Run("CatchUpRunsALapsedTickOnceMore", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period, ttl = 3 * time.Second, time.Second
		locker := func(db pglease.DB, name string) *pglease.Locker {
			return pgtest.Locker(t, db, table, name, pglease.WithTTL(ttl))
		}
		killedDB := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
		killed := mustJob(t, locker(killedDB, "killed"), pglease.WithPeriod(period), pglease.WithCatchUp())
		sleepToPhase(period, 0.05)
		run, err := killed.Lock(ctx, "job")
		require.NoError(t, err)
		first := run.(*pglease.Lease)
		killedDB.Cut(errors.New("killed")) // its heartbeats and release never reach the server again

		plain := mustJob(t, locker(pool, "plain"), pglease.WithPeriod(period))
		_, err = plain.Lock(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld, "without catch-up the tick is skipped")

		type outcome struct {
			lease *pglease.Lease
			err   error
		}
		got := make(chan outcome, 2)
		events := pgtest.NewEvents(t)
		for _, name := range []string{"b", "c"} {
			// A TTL of their own that no busy machine's heartbeat misses:
			// a run of theirs that lapsed would be caught up in its turn.
			j := mustJob(t, pgtest.Locker(t, pool, table, name, pglease.WithTTL(5*time.Second), pglease.WithHook(events.Hook)),
				pglease.WithPeriod(period), pglease.WithCatchUp())
			go func() {
				lock, err := j.Lock(ctx, "job")
				o := outcome{err: err}
				if err == nil {
					o.lease = lock.(*pglease.Lease)
				}
				got <- o
			}()
		}
		winner := <-got
		require.NoError(t, winner.err, "one replica catches up")
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		assert.True(t, winner.lease.Tick().Equal(first.Tick()), "the same tick, run once more")
		assert.Greater(t, winner.lease.Fence(), first.Fence())
		lapse := first.AcquiredAt().Add(ttl) // at the latest: no heartbeat of it reached the server
		assert.Less(t, winner.lease.AcquiredAt().Sub(lapse), 1500*time.Millisecond, "caught up within a second and a half of the lapse, before the next tick")
		assert.Equal(t, winner.lease.Fence(), row.Fence)
		time.Sleep(100 * time.Millisecond) // the run
		require.NoError(t, winner.lease.Unlock(ctx))
		loser := <-got
		require.ErrorIs(t, loser.err, pglease.ErrHeld, "the other skips the tick once the run that caught up is released")
		caughtUp := 0
		for _, e := range events.All() {
			if e.Kind == pglease.EventAcquired {
				assert.True(t, e.CaughtUp, "the acquisition says it caught up: %+v", e)
				assert.True(t, e.Tick.Equal(first.Tick()), "and which tick")
				caughtUp++
			}
		}
		assert.Equal(t, 1, caughtUp, "one replica caught up")

		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		runs, err := admin.Runs(ctx, "job", time.Hour)
		require.NoError(t, err)
		require.Len(t, runs, 2, "%+v", runs)
		assert.Equal(t, []string{"lapsed", "completed"}, []string{runs[0].Outcome, runs[1].Outcome})
		assert.Equal(t, first.Fence(), runs[0].Fence)
	})

	// Guarantee: a replica process killed (SIGKILL) in the middle of a run
	// leaves a lapsed run in the ledger. Without catch-up nobody runs that
	// tick again; with it, exactly one other replica runs it once, within
	// the TTL and a second and a half of the kill, with a greater fence.
	t.Run("AKilledRunIsLapsedAndCaughtUpOnlyWithCatchUp", func(t *testing.T) {
		t.Parallel()
		const period, ttl = 4 * time.Second, time.Second
		for _, catchUp := range []bool{false, true} {
			t.Run(fmt.Sprintf("catchUp=%v", catchUp), func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				sleepToPhase(period, 0.05)
				fence, tick, killed := killedMidRun(t, table, period)
				opts := []pglease.Option{pglease.WithPeriod(period)}
				if catchUp {
					opts = append(opts, pglease.WithCatchUp())
				}
				got := make(chan error, 2)
				var ran atomic.Int64
				for _, name := range []string{"b", "c"} {
					// A TTL of their own that no busy machine's heartbeat
					// misses: a run of theirs that lapsed would be caught up
					// in its turn.
					j := mustJob(t, pgtest.Locker(t, pool, table, name, pglease.WithTTL(5*time.Second)), opts...)
					go func() {
						lock, err := j.Lock(ctx, "job")
						if err == nil {
							lease := lock.(*pglease.Lease)
							ran.Add(1)
							assert.True(t, lease.Tick().Equal(tick), "the killed run's tick")
							assert.Greater(t, lease.Fence(), fence)
							assert.Less(t, time.Since(killed), ttl+1500*time.Millisecond, "within the TTL and a second and a half of the kill")
							time.Sleep(50 * time.Millisecond) // the run
							err = lock.Unlock(ctx)
						}
						got <- err
					}()
				}
				for range 2 {
					if err := <-got; err != nil {
						require.ErrorIs(t, err, pglease.ErrHeld)
					}
				}
				admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
				require.NoError(t, err)
				if !catchUp {
					require.Zero(t, ran.Load(), "nobody runs a lapsed tick without catch-up")
					time.Sleep(time.Until(killed.Add(ttl + 100*time.Millisecond))) // the row has lapsed
					runs, err := admin.Runs(ctx, "job", time.Hour)
					require.NoError(t, err)
					require.Len(t, runs, 1)
					assert.Equal(t, "lapsed", runs[0].Outcome, "the ledger says the killed run lapsed")
					assert.Equal(t, fence, runs[0].Fence)
					return
				}
				require.Equal(t, int64(1), ran.Load(), "one replica catches up")
				runs, err := admin.Runs(ctx, "job", time.Hour)
				require.NoError(t, err)
				require.Len(t, runs, 2)
				assert.Equal(t, []string{"lapsed", "completed"}, []string{runs[0].Outcome, runs[1].Outcome})
				assert.True(t, runs[0].Tick.Equal(runs[1].Tick), "the same tick")
			})
		}
	})

	// Guarantee: a schedule is a job's alone: refused with an error naming
	// the option elsewhere. (WithoutFenceColumn, where a catch-up cannot
	// work: TestWithoutFenceColumn/CatchUpRefused.)
	t.Run("RefusedWhereItCannotWork", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		require.ErrorIs(t, pglease.Migrate(context.Background(), pool, pglease.WithTable(table), pglease.WithPeriod(time.Second)), pglease.ErrInvalidOption,
			"Migrate takes no period")

		_, err := pgtest.Locker(t, pool, table, "c").Job(pglease.WithCatchUp())
		require.ErrorIs(t, err, pglease.ErrInvalidOption)
		require.ErrorContains(t, err, "give WithPeriod or WithCron too")

		plain := mustJob(t, pgtest.Locker(t, pool, table, "b"))
		sched, err := gocron.NewScheduler()
		require.NoError(t, err)
		defer func() { _ = sched.Shutdown() }()
		_, err = plain.Schedule(sched, gocron.NewTask(func() {}), gocron.WithName("k"))
		require.ErrorContains(t, err, "no schedule")
		assert.Empty(t, sched.Jobs(), "nothing added")
	})

	t.Run("CronInstantsEachRunOnceAcrossOffsetClocks", testTicksCronInstantsEachRunOnceAcrossOffsetClocks)
	t.Run("CronIsTheInstantNearestTheServersClock", testTicksCronIsTheInstantNearestTheServersClock)
	t.Run("CronRefusedWhereItCannotWork", testTicksCronRefusedWhereItCannotWork)
	t.Run("AnEarlierTicksRunKeepsItsLeaseAgainstItsOwnLocker", testTicksAnEarlierTicksRunKeepsItsLeaseAgainstItsOwnLocker)
	t.Run("AtMostOnceAcrossPurges", testTicksAtMostOnceAcrossPurges)
	t.Run("AtMostOnceUnderConcurrentClaimsAtItsEdge", testTicksAtMostOnceUnderConcurrentClaimsAtItsEdge)
	t.Run("AtMostOnceAfterAClaimOfUnknownOutcome", testTicksAtMostOnceAfterAClaimOfUnknownOutcome)
	t.Run("AtMostOnceAfterRevokeOrForceExpire", testTicksAtMostOnceAfterRevokeOrForceExpire)
	t.Run("AtMostOnceWithPlainClaimsOfTheKeyBetween", testTicksAtMostOnceWithPlainClaimsOfTheKeyBetween)
	t.Run("AtMostOnceWhenTheFenceDoesNotGrow", testTicksAtMostOnceWhenTheFenceDoesNotGrow)
	t.Run("IsTheOneNearestTheServersClockHoweverLateTheClaimArrives", testTicksIsTheOneNearestTheServersClockHoweverLateTheClaimArrives)
	t.Run("ATickTakenIsErrHeldToEveryClaimOfItsOwnLocker", testTicksATickTakenIsErrHeldToEveryClaimOfItsOwnLocker)
	t.Run("AtMostOnceAcrossAServerCrash", testTicksAtMostOnceAcrossAServerCrash)
	t.Run("AtMostOnceDuringARollingUpgradeWithTheMinHoldKept", testTicksAtMostOnceDuringARollingUpgradeWithTheMinHoldKept)
	t.Run("AtMostOnceUnderLostAndLateClaims", testTicksAtMostOnceUnderLostAndLateClaims)
	t.Run("CronRefusesAZoneWithoutAScheduleAsAnInvalidOption", testTicksCronRefusesAZoneWithoutAScheduleAsAnInvalidOption)
	t.Run("CronIsTheInstantNearestTheServersClockHoweverLateTheClaimArrives", testTicksCronIsTheInstantNearestTheServersClockHoweverLateTheClaimArrives)
	t.Run("CronScheduleRunsEachInstantWithThatInstantAsItsTick", testTicksCronScheduleRunsEachInstantWithThatInstantAsItsTick)
	t.Run("CronLockIsBoundedByItsTimeoutWhateverTheCrontab", testTicksCronLockIsBoundedByItsTimeoutWhateverTheCrontab)
	t.Run("CronReplicasInTwoTimeZonesAgreeOnTheInstant", testTicksCronReplicasInTwoTimeZonesAgreeOnTheInstant)
	t.Run("ASkipNeverMakesAClaimFailOnALedgerMadeBefore", testTicksASkipNeverMakesAClaimFailOnALedgerMadeBefore)
	t.Run("ASkipsFenceNeverFailsAClaimOnceTheSequenceIsFixedAsAdvised", testTicksASkipsFenceNeverFailsAClaimOnceTheSequenceIsFixedAsAdvised)
	t.Run("ARefusedClaimNamesTheTickItAskedEvenOnANewKey", testTicksARefusedClaimNamesTheTickItAskedEvenOnANewKey)
	t.Run("CatchUpRunsALapsedTickRacedByTwoReplicasOnceMore", testTicksCatchUpRunsALapsedTickRacedByTwoReplicasOnceMore)
	t.Run("CatchUpNeverRerunsAReleasedRunAcrossAServerCrash", testTicksCatchUpNeverRerunsAReleasedRunAcrossAServerCrash)
}

// eachTickAtMostOnceAcrossOffsetClocks runs a job that returns at once and
// one that takes 1.5 periods (750 ms) on three replicas of table, each on
// its own DB (db), with opts, whose gocron clocks are 0.4 of the period apart,
// no min hold, for ticks ticks, and checks that every tick of a job ran at
// most once, that each of the quick job ran exactly once, and that a run
// kept its lease to its end (a tick of the long job not run is one a run
// of an earlier tick held the key through).
func eachTickAtMostOnceAcrossOffsetClocks(t *testing.T, ticks int, db func() pglease.DB, table string, opts ...pglease.Option) {
	t.Helper()
	// A period long enough that the replica 0.4 of it behind still
	// claims its tick when its claim lands 50 ms late on a busy machine
	// (the nearest tick is judged on the server's clock); gocron's timers
	// fire within a few ms of their instant under -race on a loaded
	// machine.
	const period = 500 * time.Millisecond
	type job struct {
		name string
		run  time.Duration
	}
	jobs := []job{{"quick", 0}, {"long", 3 * period / 2}}
	var (
		mu      sync.Mutex
		runs    = map[string][]tickRun{}
		running = map[time.Time]int{} // runs begun, not yet ended, by tick
	)
	offsets := []time.Duration{-4 * period / 10, 0, 4 * period / 10}
	for i, offset := range offsets {
		name := fmt.Sprintf("replica-%d", i+1)
		l := pgtest.Locker(t, db(), table, name, append([]pglease.Option{pglease.WithTTL(5 * time.Second), pglease.WithHeartbeatInterval(200 * time.Millisecond)}, opts...)...)
		sched, err := gocron.NewScheduler(gocron.WithClock(offsetClock{clockwork.NewRealClock(), offset}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sched.Shutdown() }) // before the Locker's Close
		for _, j := range jobs {
			jl := mustJob(t, l, pglease.WithPeriod(period))
			task, named := l.Task(j.name, func(_ context.Context, lease *pglease.Lease) error {
				x := tickRun{replica: name, tick: lease.Tick(), fence: lease.Fence(), start: time.Now()}
				mu.Lock()
				running[x.tick]++
				mu.Unlock()
				time.Sleep(j.run)
				x.end, x.lostAtEnd = time.Now(), lease.Err()
				mu.Lock()
				runs[j.name] = append(runs[j.name], x)
				running[x.tick]--
				mu.Unlock()
				return nil
			})
			_, err := jl.Schedule(sched, task, named)
			require.NoError(t, err)
		}
		sched.Start()
	}
	first := time.Now().Add(time.Second).Truncate(period).Add(period) // every scheduler has started a second before
	last := first.Add(time.Duration(ticks) * period)
	// Past the last tick's window on every replica's clock, no claim takes
	// it or an earlier one: every run of them has begun by then. Those
	// still running (the long job's) end and are recorded.
	time.Sleep(time.Until(last.Add(2 * period)))
	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		for k, n := range running {
			if n > 0 && !k.After(last) {
				return false
			}
		}
		return true
	}, 10*time.Second, 10*time.Millisecond, "the runs of the ticks up to %v end", last)

	mu.Lock()
	defer mu.Unlock()
	for _, j := range jobs {
		perTick := map[time.Time][]tickRun{}
		for _, x := range runs[j.name] {
			require.False(t, x.tick.IsZero(), "%s ran with a lease of no tick", j.name)
			assert.Zero(t, x.tick.UnixNano()%int64(period), "%s: tick %v is on the period's grid", j.name, x.tick)
			require.NoError(t, x.lostAtEnd, "%s: the run of tick %v kept its lease to its end", j.name, x.tick)
			perTick[x.tick] = append(perTick[x.tick], x)
		}
		ran := 0
		for k := first; !k.After(last); k = k.Add(period) {
			got := perTick[k]
			require.LessOrEqual(t, len(got), 1, "%s: tick %v ran more than once: %+v", j.name, k, got)
			if len(got) == 1 {
				ran++
				continue
			}
			if j.run == 0 {
				t.Errorf("%s: tick %v did not run, though every replica was free", j.name, k)
				continue
			}
			// Not run: a run of an earlier tick held the key while the
			// replicas fired (from 0.4 period before the tick to 0.4
			// after, late by up to a second on a busy machine).
			held := false
			for _, x := range runs[j.name] {
				held = held || (x.tick.Before(k) && x.end.After(k.Add(-4*period/10)) && x.start.Before(k.Add(4*period/10+time.Second)))
			}
			assert.True(t, held, "%s: tick %v did not run, and no run held the key then", j.name, k)
		}
		assert.Positive(t, ran, "%s ran", j.name)
		t.Logf("figures: %s: %d of %d ticks ran, %d runs in all", j.name, ran, ticks+1, len(runs[j.name]))
	}
}

// sleepToPhase sleeps until the next instant after now that lies phase (a
// fraction of the period) past a multiple of period.
func sleepToPhase(period time.Duration, phase float64) {
	now := time.Now()
	at := now.Truncate(period).Add(time.Duration(phase * float64(period)))
	for !at.After(now) {
		at = at.Add(period)
	}
	time.Sleep(time.Until(at))
}

// nearestTick is the multiple of period nearest t.
func nearestTick(t time.Time, period time.Duration) time.Time {
	return time.Unix(0, 0).Add(t.Sub(time.Unix(0, 0)).Round(period))
}

// Guarantee: "a claim of a tick ... while a run of an earlier tick holds the
// key, is ErrHeld; a run that outlasts its period keeps its lease".
// Case: the claim of the next tick comes from the very Locker whose run
// holds the key, through JobLocker.Claim (re-entrant), or through Claim
// while gocron's Lock of the earlier tick holds it.
func testTicksAnEarlierTicksRunKeepsItsLeaseAgainstItsOwnLocker(t *testing.T) {
	t.Parallel()
	const period = time.Second
	for name, first := range map[string]func(context.Context, *pglease.JobLocker) (*pglease.Lease, error){
		"ClaimThenClaim": func(ctx context.Context, j *pglease.JobLocker) (*pglease.Lease, error) { return j.Claim(ctx, "k") },
		"LockThenClaim": func(ctx context.Context, j *pglease.JobLocker) (*pglease.Lease, error) {
			lock, err := j.Lock(ctx, "k")
			if err != nil {
				return nil, err
			}
			return lock.(*pglease.Lease), nil
		},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			l := pgtest.Locker(t, pool, table, "a")
			j := mustJob(t, l, pglease.WithPeriod(period))
			sleepToPhase(period, 0.2) // far from a tick's edge
			run, err := first(ctx, j)
			require.NoError(t, err)
			// The run of that tick outlasts its period: the next tick comes.
			time.Sleep(time.Until(run.Tick().Add(period + 150*time.Millisecond)))
			next, err := j.Claim(ctx, "k")
			if err == nil {
				t.Logf("claimed tick %v (fence %d) while the run of tick %v (fence %d) held the key", next.Tick(), next.Fence(), run.Tick(), run.Fence())
			}
			require.ErrorIs(t, err, pglease.ErrHeld, "a claim of the next tick while the run of an earlier tick holds the key")
			assert.NoError(t, run.Err(), "a run that outlasts its period keeps its lease")
		})
	}
}

// Guarantee: "each tick of a job runs at most once, whatever ... replica
// restarts": Migrate, which replicas run as they start, purges rows expired
// longer ago than the retention (24h by default, 1h at least), the tick
// with them; a tick's claim window (half a period either side) is longer
// than that for a period over twice the retention.
//
// The run is made to have happened `since` ago by moving the row's times
// back (the server's clock cannot be moved): the row then is exactly what
// a claim of that tick at that time, released at once, leaves.
func testTicksAtMostOnceAcrossPurges(t *testing.T) {
	t.Parallel()
	for name, c := range map[string]struct {
		since   time.Duration
		least   time.Duration // the period, or a whole number of hours more
		migrate []pglease.Option
	}{
		"WeeklyJobDefaultRetention":    {since: 25 * time.Hour, least: 7 * 24 * time.Hour},
		"DailyJobMinRetention":         {since: 2 * time.Hour, least: 24 * time.Hour, migrate: []pglease.Option{pglease.WithRetention(time.Hour)}},
		"DailyJobAdminPurgeMinHorizon": {since: 2 * time.Hour, least: 24 * time.Hour},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			// A period over twice the retention, for which the claim made
			// `since` ago took the same tick as a claim now.
			period := fitPeriod(t, c.least, c.since+time.Minute, time.Minute)
			a := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(period))
			run, err := a.Claim(ctx, "k")
			require.NoError(t, err)
			require.NoError(t, run.Unlock(ctx))
			_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET acquired_at = acquired_at - make_interval(secs => $1),
				expires_at = expires_at - make_interval(secs => $1) WHERE key = 'k'`, pgx.Identifier{table}.Sanitize()), c.since.Seconds())
			require.NoError(t, err)

			// A replica restarts: it runs Migrate (or an operator purges).
			if name == "DailyJobAdminPurgeMinHorizon" {
				adm, err := pglease.NewAdmin(pool, pglease.WithTable(table))
				require.NoError(t, err)
				n, err := adm.Purge(ctx, time.Hour)
				require.NoError(t, err)
				t.Logf("Admin.Purge deleted %d rows", n)
			} else {
				require.NoError(t, pglease.Migrate(ctx, pool, append([]pglease.Option{pglease.WithTable(table)}, c.migrate...)...))
			}

			// Then a claim of the job within the same tick's window: a
			// replica's clock off by less than half the period, a gocron
			// RunNow, a restarted replica's first run.
			b := mustJob(t, pgtest.Locker(t, pool, table, "b"), pglease.WithPeriod(period))
			again, err := b.Claim(ctx, "k")
			if err == nil {
				t.Logf("tick %v run by fence %d, then again by fence %d", run.Tick(), run.Fence(), again.Fence())
				assert.NotEqual(t, run.Tick(), again.Tick(), "tick %v claimed twice", run.Tick())
			}
			require.ErrorIs(t, err, pglease.ErrHeld, "the tick run %v ago, claimed again after the purge", c.since)
		})
	}
}

// fitPeriod is a period of at least least (a whole number of hours more)
// whose tick nearest now is also the one nearest every instant from before
// ago to after from now: the one tick that a test's claims all take,
// whatever the time of day the test runs at.
func fitPeriod(t *testing.T, least, before, after time.Duration) time.Duration {
	t.Helper()
	now := time.Now()
	for k := range 72 {
		p := least + time.Duration(k)*time.Hour
		tick := nearestTick(now, p)
		if nearestTick(now.Add(-before), p).Equal(tick) && nearestTick(now.Add(after), p).Equal(tick) {
			return p
		}
	}
	t.Fatalf("no period of %v or whole hours more keeps one tick from %v before now to %v after", least, before, after)
	return 0
}

// Guarantee: each tick at most once with concurrent claims at a tick's
// edge, by several Lockers and several goroutines of each, under read
// committed and under a serializable default.
func testTicksAtMostOnceUnderConcurrentClaimsAtItsEdge(t *testing.T) {
	t.Parallel()
	for name, params := range map[string]map[string]string{
		"ReadCommitted":  nil,
		"Serializable":   {"default_transaction_isolation": "serializable"},
		"RepeatableRead": {"default_transaction_isolation": "repeatable read", "TimeZone": "Pacific/Chatham"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if params != nil && pgtest.ThroughPooler() {
				t.Skip("PgBouncer refuses these startup parameters")
			}
			const period = 200 * time.Millisecond
			base := pgtest.Pool(t, nil)
			table := pgtest.Table(t, base)
			var (
				mu    sync.Mutex
				taken = map[time.Time][]int64{}
			)
			deadline := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			for i := range 4 {
				pool := pgtest.PoolWith(t, base.Config().ConnConfig.ConnString(), func(c *pgxpool.Config) {
					for k, v := range params {
						c.ConnConfig.RuntimeParams[k] = v
					}
				})
				l := pgtest.Locker(t, pool, table, fmt.Sprintf("r%d", i))
				j := mustJob(t, l, pglease.WithPeriod(period))
				for g := range 3 {
					wg.Add(1)
					go func() {
						defer wg.Done()
						rnd := rand.New(rand.NewSource(int64(i*10 + g)))
						for time.Now().Before(deadline) {
							// aim at the edge between two ticks (the midpoint)
							now := time.Now()
							edge := now.Truncate(period).Add(period / 2)
							if edge.Before(now) {
								edge = edge.Add(period)
							}
							time.Sleep(time.Until(edge.Add(time.Duration(rnd.Intn(6000)-3000) * time.Microsecond)))
							lease, err := j.Claim(context.Background(), "k")
							if err != nil {
								continue
							}
							mu.Lock()
							taken[lease.Tick()] = append(taken[lease.Tick()], lease.Fence())
							mu.Unlock()
							if rnd.Intn(2) == 0 {
								_ = lease.Unlock(context.Background())
							}
						}
					}()
				}
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			assert.NotEmpty(t, taken)
			for tick, fences := range taken {
				assert.Len(t, fences, 1, "tick %v taken by fences %v", tick, fences)
				assert.Zero(t, tick.UnixNano()%int64(period), "tick %v on the grid", tick)
			}
			t.Logf("%d ticks taken", len(taken))
		})
	}
}

// Guarantee: each tick exactly once when a claim's outcome is unknown (its
// reply lost after it committed): the claim is given back, the ledger says
// so, and the tick, which ran nothing, is claimed by the next claim of it,
// once; a claim of it after that, the first claimer's included, is ErrHeld.
func testTicksAtMostOnceAfterAClaimOfUnknownOutcome(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	// Every claim below must ask for the same tick: they run within 0.4 of
	// a period from a tenth of it, before the server's clock is nearer the
	// next tick (2.4 s, where a loaded machine took more than 0.8 s).
	const period = 6 * time.Second
	nem := pgtest.NewNemesisDB(t, pool, 1)
	la := pgtest.Locker(t, nem, table, "a")
	a := mustJob(t, la, pglease.WithPeriod(period))
	b := mustJob(t, pgtest.Locker(t, pool, table, "b"), pglease.WithPeriod(period))
	sleepToPhase(period, 0.1)
	nem.LoseReplies("claim", 1)
	_, err := a.Claim(ctx, "k")
	nem.Heal()
	require.Error(t, err)
	t.Logf("claim of unknown outcome: %v", err)
	row, ok := pgtest.ReadRow(t, pool, table, "k")
	require.True(t, ok, "the claim committed")
	assert.False(t, row.Live, "given back")
	run, err := b.Claim(ctx, "k")
	require.NoError(t, err, "another Locker runs the tick given back")
	_, err = a.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "the same Locker, the same tick, once run")
	_, err = mustJob(t, pgtest.Locker(t, pool, table, "c"), pglease.WithPeriod(period)).Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "a third Locker, the same tick, once run")
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	runs, err := admin.Runs(ctx, "k", time.Hour)
	require.NoError(t, err)
	require.Len(t, runs, 2)
	assert.Equal(t, "given back", runs[0].Outcome, "the claim whose outcome was unknown ran nothing")
	assert.Equal(t, run.Fence(), runs[1].Fence)
	assert.True(t, runs[0].Tick.Equal(runs[1].Tick))
}

// Guarantee: each tick at most once across an operator's Revoke (`pglease
// release`) or ForceExpire of its run's lease: the same tick claimed again
// once the lease lapsed is ErrHeld, the next one is not.
func testTicksAtMostOnceAfterRevokeOrForceExpire(t *testing.T) {
	t.Parallel()
	const period = 6 * time.Second
	for _, how := range []string{"Revoke", "ForceExpire"} {
		t.Run(how, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			opts := []pglease.Option{pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(300 * time.Millisecond)}
			a := mustJob(t, pgtest.Locker(t, pool, table, "a", opts...), pglease.WithPeriod(period))
			b := mustJob(t, pgtest.Locker(t, pool, table, "b", opts...), pglease.WithPeriod(period))
			sleepToPhase(period, 0.05)
			run, err := a.Claim(ctx, "k")
			require.NoError(t, err)
			adm, err := pglease.NewAdmin(pool, pglease.WithTable(table))
			require.NoError(t, err)
			if how == "Revoke" {
				_, err = adm.Revoke(ctx, "k")
			} else {
				_, err = adm.ForceExpire(ctx, "k")
			}
			require.NoError(t, err)
			time.Sleep(1200 * time.Millisecond) // past the expiry
			for name, j := range map[string]*pglease.JobLocker{"a": a, "b": b} {
				_, err = j.Claim(ctx, "k")
				require.ErrorIs(t, err, pglease.ErrHeld, "%s claimed tick %v again", name, run.Tick())
			}
		})
	}
}

// Guarantee: each tick at most once when plain claims (Locker.Claim, a job
// without a period) of the same key come between the claims of ticks: a
// row taken by a plain claim keeps its tick.
func testTicksAtMostOnceWithPlainClaimsOfTheKeyBetween(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 4 * time.Second
	la, lb := pgtest.Locker(t, pool, table, "a"), pgtest.Locker(t, pool, table, "b")
	a := mustJob(t, la, pglease.WithPeriod(period))
	sleepToPhase(period, 0.05)
	plain, err := lb.Claim(ctx, "k") // a row without a tick
	require.NoError(t, err)
	require.NoError(t, plain.Unlock(ctx))
	run, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, run.Unlock(ctx))
	plain, err = lb.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, plain.Unlock(ctx))
	plainJob := mustJob(t, lb)
	plain, err = plainJob.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, plain.Unlock(ctx))
	c := mustJob(t, pgtest.Locker(t, pool, table, "c"), pglease.WithPeriod(period))
	_, err = c.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "tick %v claimed again after plain claims", run.Tick())
}

// Guarantee: each tick at most once when the fence sequence goes back
// (a restore): the claim that draws a fence no greater than one drawn is
// given back, no replica claims the tick while the sequence is behind, and
// once the operator has fixed it the tick, which ran nothing, runs once.
func testTicksAtMostOnceWhenTheFenceDoesNotGrow(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 3 * time.Second
	la := pgtest.Locker(t, pool, table, "a")
	a := mustJob(t, la, pglease.WithPeriod(period))
	sleepToPhase(period, 0.1)
	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))
	for i := range 5 { // this Locker draws fences up to about 10
		other, err := la.Claim(ctx, fmt.Sprintf("other-%d", i))
		require.NoError(t, err)
		require.NoError(t, other.Unlock(ctx))
	}
	_, err = pool.Exec(ctx, fmt.Sprintf("SELECT setval('%s', 1, false)", table+"_fence_seq"))
	require.NoError(t, err)
	time.Sleep(time.Until(first.Tick().Add(period + 100*time.Millisecond)))
	second, err := a.Claim(ctx, "k")
	if err == nil {
		t.Logf("first fence %d tick %v, second fence %d tick %v", first.Fence(), first.Tick(), second.Fence(), second.Tick())
	}
	require.Error(t, err, "a claim that drew a fence no greater than one this Locker drew")
	t.Logf("claim with a fence that did not grow: %v", err)
	b := mustJob(t, pgtest.Locker(t, pool, table, "b"), pglease.WithPeriod(period))
	lease, err := b.Claim(ctx, "k")
	assert.Nil(t, lease, "a tick whose claim was given back is claimed again")
	require.Error(t, err)
	t.Logf("another replica's claim of that tick: %v", err)
	// The operator fixes the sequence as told; the tick, which ran
	// nothing, runs once.
	_, err = pool.Exec(ctx, fmt.Sprintf("SELECT setval('%s', (SELECT max(fence) FROM %s))", table+"_fence_seq", pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	c := mustJob(t, pgtest.Locker(t, pool, table, "c"), pglease.WithPeriod(period))
	lease, err = c.Claim(ctx, "k")
	require.NoError(t, err, "the tick given back runs once the sequence is fixed")
	assert.True(t, lease.Tick().Equal(first.Tick().Add(period)))
	_, err = mustJob(t, pgtest.Locker(t, pool, table, "d"), pglease.WithPeriod(period)).Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "and only once")
}

// Guarantee: a claim claims "the instant of the period's grid nearest the
// PostgreSQL server's clock at the claim" (lease.AcquiredAt is that clock,
// clock.t of the statement). Case: the claim statement reaches the server
// a few periods after the Locker read its own clock (a slow link, a wait
// for a pool connection, a retried serialization failure), with the
// replica's clock exactly right.
func testTicksIsTheOneNearestTheServersClockHoweverLateTheClaimArrives(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 400 * time.Millisecond
	nem := pgtest.NewNemesisDB(t, pool, 1)
	l := pgtest.Locker(t, nem, table, "a", pglease.WithTTL(10*time.Second), pglease.WithTimeout(10*time.Second))
	j := mustJob(t, l, pglease.WithPeriod(period))
	sleepToPhase(period, 0.1)
	nem.Slow(3 * period)
	lease, err := j.Claim(ctx, "k")
	nem.Heal()
	require.NoError(t, err)
	want := nearestTick(lease.AcquiredAt(), period)
	assert.True(t, lease.Tick().Equal(want), "claimed tick %v, the server's clock at the claim %v, whose nearest tick is %v",
		lease.Tick().UTC(), lease.AcquiredAt().UTC(), want.UTC())
	require.NoError(t, lease.Unlock(ctx))
}

// Guarantee: a claim of the tick its own run holds (a re-entrant claim of
// the same tick) is ErrHeld, and the run keeps its lease.
func testTicksATickTakenIsErrHeldToEveryClaimOfItsOwnLocker(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 3 * time.Second
	l := pgtest.Locker(t, pool, table, "a")
	j := mustJob(t, l, pglease.WithPeriod(period))
	sleepToPhase(period, 0.6) // the tick is the next one, not yet come
	run, err := j.Claim(ctx, "k")
	require.NoError(t, err)
	_, err = j.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld)
	_, err = j.Lock(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld)
	_, err = mustJob(t, l, pglease.WithPeriod(period)).Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "another JobLocker of the same Locker")
	require.NoError(t, run.Err(), "the run keeps its lease")
	assert.True(t, run.Tick().After(run.AcquiredAt()), "the nearest tick is ahead: %v at %v", run.Tick(), run.AcquiredAt())
	require.NoError(t, run.Unlock(ctx))
}

// Guarantee: each tick at most once across a server crash, with sessions
// that commit asynchronously (synchronous_commit = off): the claim of a
// tick is durable once acknowledged, its release need not be.
func testTicksAtMostOnceAcrossAServerCrash(t *testing.T) {
	t.Parallel()
	srv := pgtest.CrashableServer(t)
	table := pgtest.DurableTable(t, srv)
	// Longer than pgtest.Ctx's 30 s: a crash and restart on a busy
	// machine take 20 s, and claims are retried for 30 s after it.
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// A period whose tick stays the nearest for as long as a crash and a
	// restart may take on a busy machine: every claim below is of one tick.
	period := fitPeriod(t, 24*time.Hour, time.Minute, 5*time.Minute)
	pool := pgtest.PoolWith(t, srv.DSN(), func(c *pgxpool.Config) {
		c.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
	})
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithTTL(2*time.Second)), pglease.WithPeriod(period))
	run, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, run.Unlock(ctx))
	pgtest.CrashAndRestart(t, srv)
	pool2 := pgtest.PoolAt(t, srv.DSN(), nil)
	b := mustJob(t, pgtest.Locker(t, pool2, table, "b", pglease.WithTTL(2*time.Second)), pglease.WithPeriod(period))
	require.Eventually(t, func() bool {
		_, err = b.Claim(ctx, "k")
		return err == nil || errors.Is(err, pglease.ErrHeld)
	}, 30*time.Second, 50*time.Millisecond, "no claim answered within 30s of the restart")
	require.ErrorIs(t, err, pglease.ErrHeld, "tick %v claimed again after the crash", run.Tick())
	time.Sleep(2500 * time.Millisecond) // the claim's lease, restored with the crash's loss of the release, lapses
	_, err = b.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "tick %v claimed again after the crash, once its lease lapsed", run.Tick())
}

// Guarantee: during a rolling upgrade to WithPeriod, a job whose new
// replicas keep the old min hold (as GUIDE, "Ticks", says) runs each tick
// once: a replica not yet upgraded claims without a tick, and only the
// min hold keeps it from the tick an upgraded replica ran and released.
func testTicksAtMostOnceDuringARollingUpgradeWithTheMinHoldKept(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 2 * time.Second
	upgraded := mustJob(t, pgtest.Locker(t, pool, table, "new"), pglease.WithPeriod(period), pglease.WithMinHold(500*time.Millisecond))
	old := mustJob(t, pgtest.Locker(t, pool, table, "old"), pglease.WithMinHold(500*time.Millisecond))
	sleepToPhase(period, 0)
	run, err := upgraded.Lock(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, run.Unlock(ctx)) // a quick job
	time.Sleep(time.Until(run.(*pglease.Lease).Tick().Add(100 * time.Millisecond)))
	again, err := old.Lock(ctx, "k")
	if err == nil {
		t.Logf("tick %v run by %s (fence %d), then by %s (fence %d)", run.(*pglease.Lease).Tick(),
			run.(*pglease.Lease).Holder(), run.(*pglease.Lease).Fence(), again.(*pglease.Lease).Holder(), again.(*pglease.Lease).Fence())
	}
	require.ErrorIs(t, err, pglease.ErrHeld, "the tick run by an upgraded replica, run again by one not yet upgraded")
}

// Guarantee: each tick at most once, and no two runs that kept their leases
// overlap, when claim replies are lost and claims are delivered late (after
// their sender gave up), with runs that sometimes outlast their period.
func testTicksAtMostOnceUnderLostAndLateClaims(t *testing.T) {
	t.Parallel()
	const period = 300 * time.Millisecond
	base := pgtest.Pool(t, nil)
	table := pgtest.Table(t, base)
	type run struct {
		replica    int
		tick       time.Time
		fence      int64
		start, end time.Time
		kept       bool
	}
	var (
		mu   sync.Mutex
		runs []run
		wg   sync.WaitGroup
	)
	deadline := time.Now().Add(6 * time.Second)
	for i := range 3 {
		nem := pgtest.NewNemesisDB(t, base, int64(i+1))
		nem.LoseReplies("claim", 0.15)
		nem.DeliverLate("claim", 0.15, 50*time.Millisecond, 400*time.Millisecond)
		l := pgtest.Locker(t, nem, table, fmt.Sprintf("r%d", i), pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(time.Second))
		j := mustJob(t, l, pglease.WithPeriod(period))
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer nem.Heal()
			rnd := rand.New(rand.NewSource(int64(i)))
			for time.Now().Before(deadline) {
				sleepToPhase(period, float64(rnd.Intn(200)-100)/1000+1) // around each tick, +-0.1 period
				lock, err := j.Lock(context.Background(), "k")
				if err != nil {
					continue
				}
				lease := lock.(*pglease.Lease)
				x := run{replica: i, tick: lease.Tick(), fence: lease.Fence(), start: time.Now()}
				time.Sleep(time.Duration(rnd.Intn(int(2 * period))))
				x.end, x.kept = time.Now(), lease.Err() == nil
				_ = lease.Unlock(context.Background())
				mu.Lock()
				runs = append(runs, x)
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	perTick := map[time.Time][]run{}
	for _, x := range runs {
		perTick[x.tick] = append(perTick[x.tick], x)
	}
	for tick, xs := range perTick {
		assert.Len(t, xs, 1, "tick %v ran more than once: %+v", tick, xs)
	}
	for a := range runs {
		for b := a + 1; b < len(runs); b++ {
			x, y := runs[a], runs[b]
			if x.kept && y.kept && x.start.Before(y.end) && y.start.Before(x.end) {
				t.Errorf("runs of ticks %v (r%d, fence %d) and %v (r%d, fence %d) overlapped, both keeping their leases",
					x.tick, x.replica, x.fence, y.tick, y.replica, y.fence)
			}
		}
	}
	t.Logf("%d runs of %d ticks", len(runs), len(perTick))
}

// Guarantee: the instants of a crontab (WithCron), uneven ones, each run at
// most once across three replicas whose clocks (gocron's and the Locker's)
// are up to 0.2 s off, 0.4 s apart, under half the shortest gap (1 s); a
// job that returns at once runs each exactly once, on an instant of the
// crontab.
func testTicksCronInstantsEachRunOnceAcrossOffsetClocks(t *testing.T) {
	t.Parallel()
	const crontab = "*/3,1-59/3 * * * * *" // seconds 0, 1, 3, 4, 6, ...: gaps of 1 and 2 s
	table := pgtest.Table(t, pgtest.Pool(t, nil))
	var (
		mu   sync.Mutex
		runs []tickRun
	)
	for i, offset := range []time.Duration{-200 * time.Millisecond, 0, 200 * time.Millisecond} {
		name := fmt.Sprintf("replica-%d", i+1)
		l := pgtest.Locker(t, pgtest.Pool(t, nil), table, name)
		pglease.ShiftWallClock(l, offset)
		sched, err := gocron.NewScheduler(gocron.WithClock(offsetClock{clockwork.NewRealClock(), offset}))
		require.NoError(t, err)
		t.Cleanup(func() { _ = sched.Shutdown() }) // before the Locker's Close
		task, named := l.Task("report", func(_ context.Context, lease *pglease.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			runs = append(runs, tickRun{replica: name, tick: lease.Tick(), fence: lease.Fence(), start: time.Now()})
			return nil
		})
		_, err = mustJob(t, l, pglease.WithCron(crontab)).Schedule(sched, task, named)
		require.NoError(t, err)
		sched.Start()
	}
	first := time.Now().Truncate(time.Second).Add(2 * time.Second) // every scheduler has started by then
	last := first.Add(11 * time.Second)                            // 8 instants
	// The last instant's window closes on the server's clock half the next
	// gap (1 s at most) after it; a claim in flight by then is recorded
	// within half a second more.
	time.Sleep(time.Until(last.Add(1500 * time.Millisecond)))

	mu.Lock()
	defer mu.Unlock()
	perTick := map[time.Time][]tickRun{}
	for _, x := range runs {
		require.Contains(t, []int{0, 1}, x.tick.Second()%3, "tick %v is an instant of %s", x.tick, crontab)
		require.Zero(t, x.tick.Nanosecond(), "tick %v is an instant of %s", x.tick, crontab)
		perTick[x.tick.UTC()] = append(perTick[x.tick.UTC()], x)
	}
	instants := 0
	for k := first; !k.After(last); k = k.Add(time.Second) {
		if s := k.Second() % 3; s != 0 && s != 1 {
			continue
		}
		instants++
		assert.Len(t, perTick[k.UTC()], 1, "instant %v runs exactly once: %+v", k, perTick[k.UTC()])
	}
	t.Logf("figures: %d instants of %s from %v, %d runs in all", instants, crontab, first.Format("15:04:05"), len(runs))
}

// Guarantee: the tick of a crontab's job is the instant of the crontab
// nearest the server's clock at the claim, of uneven ones (minutes 0 and
// 10 of each hour), whatever the claimer's clock says within half the
// shortest gap.
func testTicksCronIsTheInstantNearestTheServersClock(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	nearest := func(x time.Time) time.Time {
		h := x.UTC().Truncate(time.Hour)
		best := h
		for _, c := range []time.Time{h.Add(-50 * time.Minute), h, h.Add(10 * time.Minute), h.Add(time.Hour)} {
			if d, b := c.Sub(x).Abs(), best.Sub(x).Abs(); d < b || d == b && c.After(best) {
				best = c
			}
		}
		return best
	}
	for i, offset := range []time.Duration{0, -4 * time.Minute, 4 * time.Minute} {
		l := pgtest.Locker(t, pool, table, fmt.Sprintf("claimer-%d", i))
		pglease.ShiftWallClock(l, offset)
		j := mustJob(t, l, pglease.WithCron("0 0,10 * * * *"))
		var before, after time.Time
		key := fmt.Sprintf("k%d", i)
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&before))
		lease, err := j.Claim(ctx, key)
		require.NoError(t, err)
		require.NoError(t, pool.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&after))
		assert.True(t, lease.Tick().Equal(nearest(before)) || lease.Tick().Equal(nearest(after)),
			"claimer's clock off by %v: tick %v, server clock from %v to %v", offset, lease.Tick(), before, after)
		require.NoError(t, lease.Unlock(ctx))
	}
}

// Guarantee: a crontab that cannot work is refused with an error that
// names it, before anything is claimed.
func testTicksCronRefusedWhereItCannotWork(t *testing.T) {
	t.Parallel()
	_, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a")
	unfenced := pgtest.Locker(t, pool, table, "b", pglease.WithoutFenceColumn())
	for name, c := range map[string]struct {
		on   *pglease.Locker
		opts []pglease.Option
		want string
	}{
		"Every":                     {l, []pglease.Option{pglease.WithCron("@every 1m")}, `WithCron("@every 1m"): @every counts from each run`},
		"NeverComes":                {l, []pglease.Option{pglease.WithCron("0 0 30 2 *")}, "none of its instants comes"},
		"Malformed":                 {l, []pglease.Option{pglease.WithCron("61 * * * *")}, `WithCron("61 * * * *")`},
		"WithPeriodToo":             {l, []pglease.Option{pglease.WithCron("0 * * * *"), pglease.WithPeriod(time.Hour)}, "a job has one schedule"},
		"CatchUpWithoutFenceColumn": {unfenced, []pglease.Option{pglease.WithCron("0 * * * *"), pglease.WithCatchUp()}, "released_at"},
		"ZoneLocal":                 {l, []pglease.Option{pglease.WithCron("CRON_TZ=Local 0 3 * * *")}, "the zone Local is each host's own"},
	} {
		_, err := c.on.Job(c.opts...)
		require.ErrorIs(t, err, pglease.ErrInvalidOption, name)
		require.ErrorContains(t, err, c.want, name)
	}
	require.ErrorIs(t, pglease.Migrate(context.Background(), pool, pglease.WithTable(table), pglease.WithCron("0 * * * *")), pglease.ErrInvalidOption,
		"Migrate takes no crontab")
	_, err := l.Job(pglease.WithCron("0 3 * * *"), pglease.WithCatchUp())
	require.NoError(t, err, "a job of a crontab catches up")
}

// Guarantee (WithCron): "a crontab that cannot work is refused with an
// error naming it, before anything is claimed". Case: a crontab that
// names its zone and nothing else ("CRON_TZ=UTC", a schedule left out of a
// configuration value), which robfig's parser slices out of range on.
func testTicksCronRefusesAZoneWithoutAScheduleAsAnInvalidOption(t *testing.T) {
	t.Parallel()
	_, pool, table := pgtest.Setup(t)
	l := pgtest.Locker(t, pool, table, "a")
	for _, crontab := range []string{"CRON_TZ=UTC", "TZ=America/New_York", "  CRON_TZ=Europe/Paris  "} {
		var err error
		require.NotPanics(t, func() { _, err = l.Job(pglease.WithCron(crontab)) }, "WithCron(%q)", crontab)
		require.ErrorIs(t, err, pglease.ErrInvalidOption, crontab)
		require.ErrorContains(t, err, "WithCron", crontab)
	}
	rows, ok := pgtest.ReadRow(t, pool, table, "k")
	assert.False(t, ok, "nothing written: %+v", rows)
}

// Guarantee (WithCron, "works the same way" as WithPeriod, whose tick is the
// one nearest the server's clock "however late the statement arrives"):
// the tick of a crontab's job is the instant nearest the server's clock at
// the claim (lease.AcquiredAt, the statement's clock.t). Case: the claim
// statement reaches the server 3 s after the Locker read its own clock (a
// slow link, a wait for a pool connection), a crontab of every second,
// the replica's clock exactly right: the instants sent (two before the
// replica's clock, two after) are all stale by then.
func testTicksCronIsTheInstantNearestTheServersClockHoweverLateTheClaimArrives(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const gap = time.Second
	nem := pgtest.NewNemesisDB(t, pool, 1)
	l := pgtest.Locker(t, nem, table, "a", pglease.WithTTL(10*time.Second), pglease.WithTimeout(10*time.Second))
	j := mustJob(t, l, pglease.WithCron("* * * * * *"))
	// The table checked first, as a running replica's is: the slow link
	// then holds the claim's statements alone, not the reads of a
	// Locker's first claim too (3 s each, before the clock is read).
	require.NoError(t, l.CheckTable(ctx))
	sleepToPhase(gap, 0.1)
	nem.Slow(3 * gap)
	lease, err := j.Claim(ctx, "k")
	nem.Heal()
	require.NoError(t, err)
	want := nearestTick(lease.AcquiredAt(), gap)
	assert.True(t, lease.Tick().Equal(want), "claimed instant %v, the server's clock at the claim %v, whose nearest instant is %v",
		lease.Tick().UTC(), lease.AcquiredAt().UTC(), want.UTC())
	require.NoError(t, lease.Unlock(ctx))
}

// Guarantee (WithCron): Schedule adds the job as a CronJob "with its zone
// named, as the replicas and gocron must all read it", and a run's tick is
// the instant gocron fired the run for, with every clock right. Case: a
// crontab in one zone (Asia/Kolkata) on a scheduler whose location is
// another (America/New_York, gocron.WithLocation): both read the crontab
// in its own zone.
func testTicksCronScheduleRunsEachInstantWithThatInstantAsItsTick(t *testing.T) {
	t.Parallel()
	_, pool, table := pgtest.Setup(t)
	zone, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	l := pgtest.Locker(t, pool, table, "a")
	other, err := time.LoadLocation("America/New_York")
	require.NoError(t, err)
	at := time.Now().Add(4 * time.Second).Truncate(time.Second).In(zone) // a daily instant, in 3 to 4 s
	crontab := fmt.Sprintf("CRON_TZ=%s %d %d %d * * *", zone, at.Second(), at.Minute(), at.Hour())
	sched, err := gocron.NewScheduler(gocron.WithLocation(other))
	require.NoError(t, err)
	t.Cleanup(func() { _ = sched.Shutdown() })
	runs := make(chan time.Time, 4)
	task, named := l.Task("daily", func(_ context.Context, lease *pglease.Lease) error { runs <- lease.Tick(); return nil })
	_, err = mustJob(t, l, pglease.WithCron(crontab)).Schedule(sched, task, named)
	require.NoError(t, err)
	sched.Start()
	select {
	case tick := <-runs:
		assert.True(t, tick.Equal(at), "%s: gocron ran the instant %v, whose run claimed the tick %v", crontab, at.UTC(), tick.UTC())
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no run of the instant %v", crontab, at.UTC())
	}
}

// Guarantee: WithTimeout "bounds each claim made by Lock" (and a claim
// honours its context). Case: a Lock away from the crontab's instants (a
// gocron Job.RunNow, WithStartImmediately, or an application's own Lock)
// of a crontab that fires every second of one month of the year, the
// month after this one: crontab.InstantsAround walks back, doubling, until two
// instants lie behind the clock, and then steps through every instant of
// that window one robfig Next at a time (2.6 million for a month),
// uncancellable, before any statement is sent.
func testTicksCronLockIsBoundedByItsTimeoutWhateverTheCrontab(t *testing.T) {
	t.Parallel()
	_, pool, table := pgtest.Setup(t)
	month := int(time.Now().UTC().Month())%12 + 1 // last came about eleven months ago
	crontab := fmt.Sprintf("* * * * %d *", month)
	l := pgtest.Locker(t, pool, table, "a")
	j := mustJob(t, l, pglease.WithCron(crontab), pglease.WithTimeout(200*time.Millisecond))
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	lock, err := j.Lock(ctx, "k")
	took := time.Since(start)
	if err == nil {
		require.NoError(t, lock.Unlock(context.Background()))
	}
	assert.Less(t, took, 1500*time.Millisecond, "%s: a Lock of a job WithTimeout(200ms), its context ending after 500ms, took %v (err %v)", crontab, took, err)
}

// claimCronEnv is the variable that makes the test binary a replica that
// claims one instant of a crontab for the job "job" and exits: the
// database URL, the table and the crontab, separated by spaces. It prints
// "claimed UNIX" (the tick's Unix seconds) or "held 0".
func claimCronEnv() string { return os.Getenv("PGLEASE_TEST_CLAIM_CRON") }

// claimCron is that replica. It exits 1 on any other failure.
func claimCron() {
	f := strings.SplitN(claimCronEnv(), " ", 3)
	if len(f) != 3 {
		fmt.Println("bad", claimCronEnv())
		os.Exit(1)
	}
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, f[0])
	if err != nil {
		fmt.Println("pool:", err)
		os.Exit(1)
	}
	l := pglease.NewLocker(pool, pglease.WithTable(f[1]), pglease.WithHolder("zoned"))
	j, err := l.Job(pglease.WithCron(f[2]))
	if err != nil {
		fmt.Println("job:", err)
		os.Exit(1)
	}
	lease, err := j.Claim(ctx, "job")
	switch {
	case errors.Is(err, pglease.ErrHeld):
		fmt.Println("held 0")
	case err != nil:
		fmt.Println("claim:", err)
		os.Exit(1)
	default:
		fmt.Printf("claimed %d\n", lease.Tick().Unix())
		_ = lease.Unlock(ctx)
	}
	_ = l.Close(ctx)
}

// Guarantee (WithCron): the crontab is read "with its zone named, as the
// replicas and gocron must all read it" (UTC when it names none), and
// replicas whose clocks agree (here exactly: one machine) claim the same
// instant of it, once. Case: a crontab without a zone on two replicas
// whose hosts are in different time zones (TZ=Asia/Kolkata, and this
// process's): had each read it in its host's zone, a daily job would run
// twice a day.
func testTicksCronReplicasInTwoTimeZonesAgreeOnTheInstant(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	zone, err := time.LoadLocation("Asia/Kolkata")
	require.NoError(t, err)
	if _, off := time.Now().In(time.Local).Zone(); off == 5*3600+1800 {
		zone, err = time.LoadLocation("America/New_York")
		require.NoError(t, err)
	}
	at := time.Now().In(zone).Truncate(time.Second) // the daily instant, now, read in the other replica's zone
	crontab := fmt.Sprintf("%d %d %d * * *", at.Second(), at.Minute(), at.Hour())

	cmd := exec.CommandContext(pgtest.Ctx(t), os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "TZ="+zone.String(), fmt.Sprintf("PGLEASE_TEST_CLAIM_CRON=%s %s %s", pgtest.Server.DSN(), table, crontab))
	cmd.Stderr = os.Stderr
	out, err := cmd.Output()
	require.NoError(t, err, "%s", out)
	var word string
	var unix int64
	_, err = fmt.Sscan(string(out), &word, &unix)
	require.NoError(t, err, "%s", out)
	require.Equal(t, "claimed", word, "the replica in %s claims first", zone)

	lease, err := mustJob(t, pgtest.Locker(t, pool, table, "here"), pglease.WithCron(crontab)).Claim(ctx, "job")
	if err == nil {
		defer func() { require.NoError(t, lease.Unlock(ctx)) }()
		t.Errorf("%s: the replica in %s ran the instant %v, and this process's replica (%s), on the same clock, ran %v",
			crontab, zone, time.Unix(unix, 0).UTC(), time.Now().Format("MST"), lease.Tick().UTC())
		return
	}
	require.ErrorIs(t, err, pglease.ErrHeld, "the daily instant is taken")
}

// Guarantee: a skipped tick never makes a claim fail. A ledger made before
// the skipped rows (by an earlier Migrate, or an earlier pglease.Schema()
// applied by a migration tool) is keyed by the fence alone: the claim of a
// free tick takes it, and a claim that finds an earlier tick's run holding
// the key is ErrHeld, its skip not entered (the run's row has its fence).
func testTicksASkipNeverMakesAClaimFailOnALedgerMadeBefore(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	runs := pgx.Identifier{table + "_run"}.Sanitize()
	_, err := pool.Exec(ctx, "ALTER TABLE "+runs+" DROP CONSTRAINT "+pgx.Identifier{table + "_run_pkey"}.Sanitize()+", ADD PRIMARY KEY (fence)")
	require.NoError(t, err)
	const period = time.Second
	a := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(period))
	b := mustJob(t, pgtest.Locker(t, pool, table, "b"), pglease.WithPeriod(period))
	sleepToPhase(period, 0.2)
	run, err := a.Claim(ctx, "k")
	require.NoError(t, err, "the claim of a free tick")
	time.Sleep(time.Until(run.Tick().Add(period + 100*time.Millisecond)))
	_, err = b.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "a claim that finds the run of an earlier tick holding the key")
	require.ErrorContains(t, err, "skipped")
	var rows int
	require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+runs).Scan(&rows))
	assert.Equal(t, 1, rows, "the run alone")
	require.NoError(t, run.Unlock(ctx))
}

// Guarantee (the ledger's skipped rows): "the skip never makes a claim
// fail", and "fences: can any fence-based check now confuse a skip's
// fence with a run's?". Case: the fence sequence is restarted behind the
// table (a restore, a migration tool's down and up); the Locker's check
// refuses every claim and names the fix, a setval to the table's largest
// fence, which the operator runs as told. A skipped row's fence, drawn from
// the same sequence, is in the ledger only, above every fence of the lease
// table: after the fix the next claim of a tick must still take it.
func testTicksASkipsFenceNeverFailsAClaimOnceTheSequenceIsFixedAsAdvised(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = time.Second
	job := func(name string) *pglease.JobLocker {
		return mustJob(t, pgtest.Locker(t, pool, table, name), pglease.WithPeriod(period))
	}
	sleepToPhase(period, 0.2)
	run, err := job("a").Claim(ctx, "k")
	require.NoError(t, err)
	const skipped = 3
	b := job("b")
	for i := 1; i <= skipped; i++ { // the next ticks, skipped: the run of the first holds the key
		time.Sleep(time.Until(run.Tick().Add(time.Duration(i) * period)))
		_, err = b.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.ErrorContains(t, err, "still holds the key")
	}
	require.NoError(t, run.Unlock(ctx))

	// The sequence goes back; the check refuses claims and names the fix.
	_, err = pool.Exec(ctx, fmt.Sprintf("SELECT setval('%s', 1, false)", table+"_fence_seq"))
	require.NoError(t, err)
	_, err = job("c").Claim(ctx, "k")
	require.Error(t, err, "a claim with the sequence behind the table")
	i := strings.Index(err.Error(), "SELECT setval(")
	require.GreaterOrEqual(t, i, 0, "the error names the fix: %v", err)
	fix, depth := err.Error()[i:], 0
	for j, r := range fix { // the statement, up to its balancing parenthesis
		if r == '(' {
			depth++
		} else if r == ')' {
			if depth--; depth == 0 {
				fix = fix[:j+1]
				break
			}
		}
	}
	t.Logf("the fix the error names: %s", fix)
	dump := func(when string) {
		rows, err := pool.Query(ctx, fmt.Sprintf("SELECT fence, tick, coalesce(outcome, '') FROM %s ORDER BY fence", pgx.Identifier{table + "_run"}.Sanitize()))
		require.NoError(t, err)
		for rows.Next() {
			var f int64
			var tk time.Time
			var o string
			require.NoError(t, rows.Scan(&f, &tk, &o))
			t.Logf("%s: run fence %d tick %v %s", when, f, tk, o)
		}
		var lf int64
		require.NoError(t, pool.QueryRow(ctx, fmt.Sprintf("SELECT max(fence) FROM %s", pgx.Identifier{table}.Sanitize())).Scan(&lf))
		t.Logf("%s: lease max fence %d", when, lf)
	}
	dump("before the fix")
	_, err = pool.Exec(ctx, fix)
	require.NoError(t, err)

	time.Sleep(time.Until(run.Tick().Add((skipped+1)*period + 100*time.Millisecond)))
	next, err := job("d").Claim(ctx, "k")
	dump("after the claim")
	require.NoError(t, err, "the claim of a free tick once the sequence is fixed as told")
	require.True(t, next.Tick().Equal(run.Tick().Add((skipped+1)*period)))
	require.NoError(t, next.Unlock(ctx))
}

// Guarantee: a claim of a tick that takes nothing is ErrHeld naming the
// tick it claimed (tickHeldError, Event.Tick), never a wrong one. Case:
// replicas claim a job's first tick at once, on a key no row has yet: the
// losers' snapshots may not see the winner's row.
func testTicksARefusedClaimNamesTheTickItAskedEvenOnANewKey(t *testing.T) {
	t.Parallel()
	ctx, _, table := pgtest.Setup(t)
	const period = 10 * time.Second
	var jobs []*pglease.JobLocker
	for i := range 6 {
		jobs = append(jobs, mustJob(t, pgtest.Locker(t, pgtest.Pool(t, nil), table, fmt.Sprintf("r%d", i)), pglease.WithPeriod(period)))
	}
	sleepToPhase(period, 0.1)
	tick := nearestTick(time.Now(), period).UTC().Format(time.RFC3339Nano)
	var (
		mu    sync.Mutex
		wrong []string
		held  int
	)
	for round := range 30 {
		key := fmt.Sprintf("k%d", round)
		start := make(chan struct{})
		var wg sync.WaitGroup
		for _, j := range jobs {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-start
				_, err := j.Claim(ctx, key)
				if !errors.Is(err, pglease.ErrHeld) {
					return
				}
				mu.Lock()
				defer mu.Unlock()
				held++
				if strings.Contains(err.Error(), "0001-01-01") || !strings.Contains(err.Error(), tick) {
					wrong = append(wrong, err.Error())
				}
			}()
		}
		close(start)
		wg.Wait()
	}
	t.Logf("%d refusals", held)
	assert.Empty(t, wrong, "refusals that do not name the tick claimed")
}

// Guarantee: with WithCatchUp, each tick runs at least once while a
// replica lives, also when two replicas' Locks of it race (their timers
// fire together, as gocron's do on the period's grid): a wins, then a is
// cut off (killed) and its run lapses; b, whose Lock lost to a's run,
// whether its claim saw a's row or not (a committed after its snapshot),
// runs the tick once more, with a greater fence. NewKey: the job's very
// first tick, no row yet; AfterAnEarlierTick: the row carries the previous
// tick, run and released.
func testTicksCatchUpRunsALapsedTickRacedByTwoReplicasOnceMore(t *testing.T) {
	t.Parallel()
	for name, earlier := range map[string]bool{"NewKey": false, "AfterAnEarlierTick": true} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			_, pool, table := pgtest.Setup(t)
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
			defer cancel()
			const period, ttl = 20 * time.Second, 500 * time.Millisecond
			b := mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithTTL(5*time.Second)), pglease.WithPeriod(period), pglease.WithCatchUp())
			sleepToPhase(period, 0.05)
			var bWon, caughtUp int
			for round := range 16 {
				key := fmt.Sprintf("job%d", round)
				if earlier { // the previous tick's run, released (as a run and its release leave the row)
					_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at, released_at, tick)
						VALUES ($1, 'z#0000000000000000', clock_timestamp() - interval '20 s', clock_timestamp() - interval '19 s', clock_timestamp() - interval '19 s',
						        to_timestamp(0) + make_interval(secs => (round(extract(epoch FROM clock_timestamp()) / 20) * 20 - 20)))`, pgx.Identifier{table}.Sanitize()), key)
					require.NoError(t, err)
				}
				db := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
				a := mustJob(t, pgtest.Locker(t, db, table, fmt.Sprintf("a%d", round), pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
				warm, err := a.Claim(ctx, "warm-"+key) // a's connection and table check ready, as b's are
				require.NoError(t, err)
				require.NoError(t, warm.Unlock(ctx))
				type result struct {
					lease *pglease.Lease
					err   error
				}
				start := make(chan struct{})
				aGot, bGot := make(chan result, 1), make(chan result, 1)
				lock := func(j *pglease.JobLocker, got chan<- result) {
					lock, err := j.Lock(ctx, key)
					r := result{err: err}
					if err == nil {
						r.lease = lock.(*pglease.Lease)
					}
					got <- r
				}
				go func() { <-start; lock(a, aGot) }()
				go func() {
					<-start
					// b's timer fires a moment after a's (0 to 400 µs, spinning)
					for until := time.Now().Add(time.Duration(round%5) * 100 * time.Microsecond); time.Now().Before(until); {
					}
					lock(b, bGot)
				}()
				close(start)
				var ra result
				select {
				case ra = <-aGot:
				case rb := <-bGot: // b won: a waits for b's run, and skips once it is released
					require.NoError(t, rb.err, "round %d: the loser waits for the winner's run", round)
					require.NoError(t, rb.lease.Unlock(ctx))
					ra = <-aGot
					require.ErrorIs(t, ra.err, pglease.ErrHeld, "round %d", round)
					bWon++
					continue
				}
				require.NoError(t, ra.err, "round %d: the loser waits for the winner's run", round)
				db.Cut(errors.New("killed")) // a's run lapses without a release
				select {
				case rb := <-bGot:
					require.NoError(t, rb.err, "round %d: b catches up the tick whose run (fence %d) lapsed", round, ra.lease.Fence())
					assert.True(t, rb.lease.Tick().Equal(ra.lease.Tick()), "round %d: the same tick", round)
					assert.Greater(t, rb.lease.Fence(), ra.lease.Fence(), "round %d", round)
					require.NoError(t, rb.lease.Unlock(ctx))
					caughtUp++
				case <-time.After(ttl + 10*time.Second):
					t.Fatalf("round %d: b's Lock did not return within the lapse and 10 s", round)
				}
			}
			t.Logf("figures: b won %d rounds, caught up a lapsed run in %d", bWon, caughtUp)
		})
	}
}

// Guarantee: with WithCatchUp, a run completed and released is never run
// again, though the server crashes right after its Unlock returned: the
// release of a run commits synchronously, so the run does not come back
// reading as lapsed, and a catch-up replica skips its tick.
func testTicksCatchUpNeverRerunsAReleasedRunAcrossAServerCrash(t *testing.T) {
	t.Parallel()
	srv := pgtest.CrashableServer(t)
	table := pgtest.DurableTable(t, srv)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	// One tick nearest the server's clock for the whole test.
	period := fitPeriod(t, 24*time.Hour, time.Minute, 5*time.Minute)
	const ttl = 2 * time.Second
	a := mustJob(t, pgtest.Locker(t, pgtest.PoolAt(t, srv.DSN(), nil), table, "a", pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
	lock, err := a.Lock(ctx, "k")
	require.NoError(t, err)
	run := lock.(*pglease.Lease)
	require.NoError(t, run.Unlock(ctx), "the run completed and was released")
	pgtest.CrashAndRestart(t, srv)

	pool := pgtest.PoolAt(t, srv.DSN(), nil)
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
	var again gocron.Lock
	require.Eventually(t, func() bool {
		again, err = b.Lock(ctx, "k")
		return err == nil || errors.Is(err, pglease.ErrHeld)
	}, 30*time.Second, 50*time.Millisecond, "no claim answered within 30s of the restart: %v", err)
	if err == nil {
		l := again.(*pglease.Lease)
		t.Errorf("tick %v, run by fence %d and released, was run again by fence %d (catch-up) after the crash", run.Tick(), run.Fence(), l.Fence())
		_ = again.Unlock(ctx)
	}
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	runs, err := admin.Runs(ctx, "k", time.Hour)
	require.NoError(t, err)
	if r, ok := runOf(runs, run.Fence()); assert.True(t, ok) {
		assert.NotEqual(t, "lapsed", r.Outcome, "the released run reads as lapsed: %+v", runs)
	}
}
