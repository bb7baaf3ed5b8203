package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jonboulle/clockwork"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

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
		const period = 600 * time.Millisecond
		const ticks = 20
		table := pgtest.Table(t, pgtest.Pool(t, nil))
		type job struct {
			name string
			run  time.Duration
		}
		jobs := []job{{"quick", 0}, {"long", 3 * period / 2}}
		var (
			mu   sync.Mutex
			runs = map[string][]tickRun{}
		)
		offsets := []time.Duration{-4 * period / 10, 0, 4 * period / 10}
		for i, offset := range offsets {
			name := fmt.Sprintf("replica-%d", i+1)
			l := pgtest.Locker(t, pgtest.Pool(t, nil), table, name, pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(200*time.Millisecond))
			sched, err := gocron.NewScheduler(gocron.WithClock(offsetClock{clockwork.NewRealClock(), offset}))
			require.NoError(t, err)
			t.Cleanup(func() { _ = sched.Shutdown() }) // before the Locker's Close
			for _, j := range jobs {
				jl := mustJob(t, l, pglease.WithPeriod(period))
				task, named := l.Task(j.name, func(_ context.Context, lease *pglease.Lease) {
					x := tickRun{replica: name, tick: lease.Tick(), fence: lease.Fence(), start: time.Now()}
					time.Sleep(j.run)
					x.end, x.lostAtEnd = time.Now(), lease.Err()
					mu.Lock()
					runs[j.name] = append(runs[j.name], x)
					mu.Unlock()
				})
				_, err := jl.Schedule(sched, task, named)
				require.NoError(t, err)
			}
			sched.Start()
		}
		first := time.Now().Truncate(period).Add(2 * period) // every scheduler has started by then
		last := first.Add(ticks * period)
		time.Sleep(time.Until(last.Add(2 * period)))

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
				// after, late by up to half a second on a busy machine).
				held := false
				for _, x := range runs[j.name] {
					held = held || (x.tick.Before(k) && x.end.After(k.Add(-4*period/10)) && x.start.Before(k.Add(4*period/10+500*time.Millisecond)))
				}
				assert.True(t, held, "%s: tick %v did not run, and no run held the key then", j.name, k)
			}
			assert.Positive(t, ran, "%s ran", j.name)
			t.Logf("figures: %s: %d of %d ticks ran, %d runs in all", j.name, ran, ticks+1, len(runs[j.name]))
		}
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
	// says that the earlier tick's run holds the key.
	t.Run("ARunThatOutlastsItsPeriodSkipsTheNextTick", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const period = time.Second
		la, lb := pgtest.Locker(t, pool, table, "a"), pgtest.Locker(t, pool, table, "b")
		a, b := mustJob(t, la, pglease.WithPeriod(period)), mustJob(t, lb, pglease.WithPeriod(period))
		lock, err := a.Lock(ctx, "k")
		require.NoError(t, err)
		held, ok := la.Held("k")
		require.True(t, ok)
		time.Sleep(time.Until(held.Tick().Add(period)))
		for name, j := range map[string]*pglease.JobLocker{"its own Locker": a, "another": b} {
			_, err := j.Lock(ctx, "k")
			require.ErrorIs(t, err, pglease.ErrHeld, name)
			if j == b {
				require.ErrorContains(t, err, "still holds the key", name)
			}
		}
		require.NoError(t, held.Err(), "the run kept its lease")
		require.NoError(t, lock.Unlock(ctx))
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

	// Guarantee: a schedule needs a table with the tick column, and is a
	// job's alone: refused with an error naming the option elsewhere.
	t.Run("RefusedWhereItCannotWork", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		unfenced := pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn())
		_, err := unfenced.Job(pglease.WithPeriod(time.Second))
		var oe *pglease.OptionError
		require.ErrorAs(t, err, &oe)
		require.ErrorContains(t, err, "WithPeriod")
		require.ErrorContains(t, err, "tick column")

		require.ErrorIs(t, pglease.Migrate(context.Background(), pool, pglease.WithTable(table), pglease.WithPeriod(time.Second)), pglease.ErrInvalidOption,
			"Migrate takes no period")

		plain := mustJob(t, pgtest.Locker(t, pool, table, "b"))
		sched, err := gocron.NewScheduler()
		require.NoError(t, err)
		defer func() { _ = sched.Shutdown() }()
		_, err = plain.Schedule(sched, gocron.NewTask(func() {}), gocron.WithName("k"))
		require.ErrorContains(t, err, "no schedule")
		assert.Empty(t, sched.Jobs(), "nothing added")
	})
}
