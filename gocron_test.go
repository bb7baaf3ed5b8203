package pglease_test

import (
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// scheduler is a started gocron scheduler with opts, shut down at cleanup.
func scheduler(t *testing.T, opts ...gocron.SchedulerOption) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler(opts...)
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown() })
	s.Start()
	return s
}

// onGrid reports whether t is a multiple of period since the Unix epoch.
func onGrid(t time.Time, period time.Duration) bool {
	return t.UnixNano()%int64(period) == 0
}

// gridScheduler is a scheduler without a Locker, shut down at cleanup.
func gridScheduler(t *testing.T) gocron.Scheduler {
	t.Helper()
	s, err := gocron.NewScheduler()
	require.NoError(t, err)
	t.Cleanup(func() { _ = s.Shutdown() })
	return s
}

// TestStartOnGrid pins StartOnGrid: runs fall on the multiples of the
// period since the Unix epoch, whenever each scheduler started.
func TestStartOnGrid(t *testing.T) {
	t.Parallel()
	// Guarantee: StartOnGrid schedules the next multiples of the period since
	// the Unix epoch.
	t.Run("NextMultiplesSinceTheEpoch", func(t *testing.T) {
		t.Parallel()
		for _, period := range []time.Duration{time.Second, 7 * time.Second, time.Minute, 90 * time.Minute, 24 * time.Hour} {
			for _, started := range []bool{false, true} { // job added before Start, or to a running scheduler
				s := gridScheduler(t)
				if started {
					s.Start()
				}
				before := time.Now()
				j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {}), pglease.StartOnGrid(period))
				require.NoError(t, err)
				s.Start()
				after := time.Now()
				next, err := j.NextRuns(3)
				require.NoError(t, err)
				require.Len(t, next, 3)
				assert.True(t, onGrid(next[0], period), "period %v: first run %v is on the grid", period, next[0])
				assert.False(t, next[0].Before(before), "period %v: first run %v is not in the past (%v)", period, next[0], before)
				assert.True(t, next[0].Before(after.Add(period)), "period %v: first run %v is the next multiple after %v", period, next[0], after)
				assert.Equal(t, period, next[1].Sub(next[0]), "period %v", period)
				assert.Equal(t, period, next[2].Sub(next[1]), "period %v", period)
			}
		}
	})

	// Guarantee: StartOnGrid puts minutes on second zero and days on midnight
	// UTC.
	t.Run("MinutesOnSecondZeroDaysOnMidnight", func(t *testing.T) {
		t.Parallel()
		for period, want := range map[time.Duration]func(time.Time) bool{
			time.Minute:      func(at time.Time) bool { return at.UTC().Second() == 0 && at.Nanosecond() == 0 },
			10 * time.Second: func(at time.Time) bool { return at.UTC().Second()%10 == 0 && at.Nanosecond() == 0 },
			24 * time.Hour: func(at time.Time) bool {
				u := at.UTC()
				return u.Hour() == 0 && u.Minute() == 0 && u.Second() == 0 && u.Nanosecond() == 0
			},
		} {
			s := gridScheduler(t)
			j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {}), pglease.StartOnGrid(period))
			require.NoError(t, err)
			s.Start()
			next, err := j.NextRun()
			require.NoError(t, err)
			assert.True(t, want(next), "period %v: first run %v", period, next.UTC())
		}
	})

	// A replica's scheduler may start long after its job was added (a slow
	// start-up): its first run is then the next multiple after the start, and
	// no run is made for the multiples that passed meanwhile.
	t.Run("LateStartRunsFirstAtTheNextMultiple", func(t *testing.T) {
		t.Parallel()
		const period = 40 * time.Millisecond
		s := gridScheduler(t)
		runs := make(chan time.Time, 10)
		j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() { runs <- time.Now() }), pglease.StartOnGrid(period))
		require.NoError(t, err)
		time.Sleep(3 * period) // three multiples pass before the scheduler starts
		started := time.Now()
		s.Start()
		next, err := j.NextRun()
		require.NoError(t, err)
		assert.True(t, onGrid(next, period), "first run %v is on the grid", next)
		assert.False(t, next.Before(started), "first run %v is not one that passed before the start (%v)", next, started)
		assert.True(t, next.Before(started.Add(period)), "first run %v is the next multiple after the start (%v)", next, started)
		select {
		case at := <-runs:
			assert.False(t, at.Before(next), "the first run (%v) waited for its multiple (%v)", at, next)
		case <-time.After(10 * period):
			t.Fatal("the job never ran")
		}
	})

	// Schedulers started at different moments, as replicas are, run the job at
	// the same instants: the grid's, not each one's start plus whole periods.
	t.Run("SchedulersStartedApartRunTogether", func(t *testing.T) {
		t.Parallel()
		const period = 200 * time.Millisecond
		type run struct {
			replica int
			at      time.Time
		}
		runs := make(chan run, 100)
		var nexts []time.Time
		for i, wait := range []time.Duration{0, period / 3, period * 5 / 4} {
			time.Sleep(wait) // the moment this replica starts, off the grid
			s := gridScheduler(t)
			j, err := s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() { runs <- run{i, time.Now()} }), pglease.StartOnGrid(period))
			require.NoError(t, err)
			s.Start()
			next, err := j.NextRun()
			require.NoError(t, err)
			nexts = append(nexts, next)
		}
		for i, next := range nexts {
			assert.True(t, onGrid(next, period), "replica %d: first run %v on the grid", i, next)
		}
		// Each replica fires shortly after a multiple of the period (its
		// timer's latency), far from the middle between two multiples.
		for range 6 {
			select {
			case r := <-runs:
				late := time.Duration(r.at.UnixNano() % int64(period))
				assert.Less(t, late, period/2, "replica %d ran %v after a multiple of the period", r.replica, late)
			case <-time.After(5 * period):
				t.Fatal("the replicas stopped running")
			}
		}
	})

	// Guarantee: StartOnGrid refuses a period that is not positive.
	t.Run("RefusesANonPositivePeriod", func(t *testing.T) {
		t.Parallel()
		for _, period := range []time.Duration{0, -time.Second} {
			func() {
				defer func() {
					err, ok := recover().(error)
					require.True(t, ok, "StartOnGrid(%v) panics with an error", period)
					require.ErrorIs(t, err, pglease.ErrInvalidOption)
					assert.Equal(t, "StartOnGrid", pglease.OptionNamed(err))
					assert.Contains(t, err.Error(), "must be positive")
				}()
				pglease.StartOnGrid(period)
			}()
		}
	})
}
