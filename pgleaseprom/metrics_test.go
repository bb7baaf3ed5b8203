package pgleaseprom_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseprom"
)

func newMetrics(t *testing.T, opts pgleaseprom.Opts) (*pgleaseprom.Metrics, *prometheus.Registry) {
	t.Helper()
	m := pgleaseprom.New(opts)
	reg := prometheus.NewPedanticRegistry()
	require.NoError(t, reg.Register(m))
	return m, reg
}

func outcome(o string) map[string]string { return map[string]string{"outcome": o} }

func TestClaimsAreCountedByOutcomeAcrossLockersSharingOneMetrics(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})

	a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(m.Hook))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(m.Hook))
	noTable := pgtest.Locker(t, pool, pgtest.TableName(), "c", pglease.WithHook(m.Hook))

	assert.Zero(t, value(t, reg, "pglease_claims_total", outcome("failed")), "every outcome is exported at zero from the start")

	_, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	for range 2 {
		_, err = b.Claim(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld)
	}
	_, err = noTable.Claim(ctx, "job")
	require.Error(t, err, "the table does not exist")

	assert.Equal(t, 1.0, value(t, reg, "pglease_claims_total", outcome("acquired")))
	assert.Equal(t, 2.0, value(t, reg, "pglease_claims_total", outcome("held")))
	assert.Equal(t, 1.0, value(t, reg, "pglease_claims_total", outcome("failed")))
	// One vocabulary with the Event kinds (claim_failed) and pgleaseotel.
	assert.Equal(t, 1.0, value(t, reg, "pglease_claims_total", outcome(strings.TrimPrefix(pglease.EventClaimFailed.String(), "claim_"))))
	assert.Equal(t, 1.0, value(t, reg, "pglease_leases_held", nil))

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems, "metric names, units and help follow Prometheus conventions")
	families, err := reg.Gather()
	require.NoError(t, err)
	for _, f := range families {
		for _, s := range f.GetMetric() {
			for _, l := range s.GetLabel() {
				assert.NotEqual(t, "key", l.GetName(), "%s has no key label unless PerKey is set", f.GetName())
			}
		}
	}
}

func TestLeasesHeldGaugeCountsEachLeaseOnceThroughReleaseLossAndUnlockOfTheLostLease(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(m.Hook),
		pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
	held := func() float64 { return value(t, reg, "pglease_leases_held", nil) }

	leases := map[string]*pglease.Lease{}
	for _, key := range []string{"k1", "k2", "k3"} {
		lease, err := l.Claim(ctx, key)
		require.NoError(t, err)
		leases[key] = lease
	}
	assert.Equal(t, 3.0, held())

	require.NoError(t, leases["k1"].Unlock(ctx))
	assert.Equal(t, 2.0, held())
	assert.Equal(t, 1.0, value(t, reg, "pglease_releases_total", outcome("released")))

	// Another holder takes k2's row behind the Locker's back; the next
	// heartbeat finds it gone and the lease is lost.
	_, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = 'thief' WHERE key = 'k2'`, pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)
	select {
	case <-leases["k2"].Done():
	case <-time.After(10 * time.Second):
		t.Fatal("the stolen lease was not found lost")
	}
	require.ErrorIs(t, leases["k2"].Err(), pglease.ErrLost)
	assert.Equal(t, 1.0, value(t, reg, "pglease_leases_lost_total", nil))
	assert.Equal(t, 1.0, held())

	// Unlocking the lost lease reports ErrLost: a release outcome, not a
	// second decrement of the gauge.
	require.ErrorIs(t, leases["k2"].Unlock(ctx), pglease.ErrLost)
	assert.Equal(t, 1.0, value(t, reg, "pglease_releases_total", outcome("lost")))
	assert.Equal(t, 1.0, held(), "k3 is still held")

	require.NoError(t, l.Close(ctx))
	assert.Equal(t, 0.0, held())
	assert.Equal(t, 2.0, value(t, reg, "pglease_releases_total", outcome("released")))
	assert.Equal(t, 0.0, value(t, reg, "pglease_releases_total", outcome("failed")))
}

func TestHeartbeatRoundsFeedTheLatencyHistogramAndFailedRoundsTheirCounter(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	db := pgtest.NewFaultyDB(pool)
	l := pgtest.Locker(t, db, table, "a", pglease.WithHook(m.Hook),
		pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond))

	lease, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	require.Eventually(t, func() bool {
		n, _ := histogram(t, reg, "pglease_heartbeat_duration_seconds")
		return n >= 3
	}, 10*time.Second, 10*time.Millisecond, "three heartbeat rounds are observed")
	_, sum := histogram(t, reg, "pglease_heartbeat_duration_seconds")
	assert.Positive(t, sum, "each round's round trip took some time")
	assert.Zero(t, value(t, reg, "pglease_heartbeat_failures_total", nil))

	db.SetFail("heartbeat", errors.New("injected heartbeat failure"))
	require.Eventually(t, func() bool {
		return value(t, reg, "pglease_heartbeat_failures_total", nil) >= 2
	}, 10*time.Second, 10*time.Millisecond, "failed rounds are counted")
	db.SetFail("heartbeat", nil)
	before, _ := histogram(t, reg, "pglease_heartbeat_duration_seconds")
	require.Eventually(t, func() bool {
		n, _ := histogram(t, reg, "pglease_heartbeat_duration_seconds")
		return n > before
	}, 10*time.Second, 10*time.Millisecond, "heartbeats succeed again")
	require.NoError(t, lease.Err(), "an outage shorter than the TTL loses nothing")
	assert.Zero(t, value(t, reg, "pglease_leases_lost_total", nil))
	assert.Equal(t, 1.0, value(t, reg, "pglease_leases_held", nil))
}

func TestPerKeyLabelsClaimHeldLostAndReleaseSeriesWithTheKey(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{
		Namespace: "app", Subsystem: "jobs", PerKey: true, ConstLabels: prometheus.Labels{"service": "billing"},
	})
	a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(m.Hook))
	b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(m.Hook))
	series := func(labels ...string) map[string]string {
		out := map[string]string{"service": "billing"}
		for i := 0; i+1 < len(labels); i += 2 {
			out[labels[i]] = labels[i+1]
		}
		return out
	}

	alpha, err := a.Claim(ctx, "alpha")
	require.NoError(t, err)
	_, err = a.Claim(ctx, "beta")
	require.NoError(t, err)
	_, err = b.Claim(ctx, "alpha")
	require.ErrorIs(t, err, pglease.ErrHeld)
	require.NoError(t, alpha.Unlock(ctx))

	assert.Equal(t, 1.0, value(t, reg, "app_jobs_claims_total", series("outcome", "acquired", "key", "alpha")))
	assert.Equal(t, 1.0, value(t, reg, "app_jobs_claims_total", series("outcome", "acquired", "key", "beta")))
	assert.Equal(t, 1.0, value(t, reg, "app_jobs_claims_total", series("outcome", "held", "key", "alpha")))
	assert.Equal(t, 0.0, value(t, reg, "app_jobs_leases_held", series("key", "alpha")), "alpha was released")
	assert.Equal(t, 1.0, value(t, reg, "app_jobs_leases_held", series("key", "beta")))
	assert.Equal(t, 1.0, value(t, reg, "app_jobs_releases_total", series("outcome", "released", "key", "alpha")))
}

func TestLeasesHeldGaugeCountsALeaseLostAndThenUnlockedOnce(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	held := func() float64 { return value(t, reg, "pglease_leases_held", nil) }
	ev := func(kind pglease.EventKind, fence int64) pglease.Event {
		e := pglease.Event{Kind: kind, Key: "job", Holder: "a", Fence: fence}
		if kind == pglease.EventReleaseFailed {
			e.Err = fmt.Errorf("unlock: %w", pglease.ErrLost)
		}
		return e
	}

	// Lost, then unlocked: two ends for one lease.
	m.Hook(ev(pglease.EventAcquired, 3))
	m.Hook(ev(pglease.EventLost, 3))
	m.Hook(ev(pglease.EventReleaseFailed, 3))
	assert.Equal(t, 0.0, held())

	// A claim that got a row but no lease reports its fence and nothing
	// else: it was never counted.
	m.Hook(ev(pglease.EventClaimFailed, 5))
	assert.Equal(t, 0.0, held())

	// The same key and fence from another holder is another lease.
	m.Hook(ev(pglease.EventAcquired, 4))
	other := ev(pglease.EventAcquired, 4)
	other.Holder = "b"
	m.Hook(other)
	assert.Equal(t, 2.0, held())
	m.Hook(ev(pglease.EventReleased, 4))
	assert.Equal(t, 1.0, held())

	// Many leases lost and then unlocked leave nothing behind.
	for f := int64(100); f < 3000; f++ {
		m.Hook(ev(pglease.EventAcquired, f))
		m.Hook(ev(pglease.EventLost, f))
		m.Hook(ev(pglease.EventReleaseFailed, f))
	}
	assert.Equal(t, 1.0, held())
	assert.Equal(t, 2900.0+1, value(t, reg, "pglease_releases_total", outcome("lost")))
}

func TestElectionsAreCountedWhenAnElectorBecomesTheLeader(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	quiet := pglease.WithLogger(slog.New(slog.DiscardHandler))
	elector := func(holder string) *pglease.Elector {
		l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(holder), pglease.WithHook(m.Hook), quiet)
		t.Cleanup(func() { _ = l.Close(context.Background()) })
		e, err := pglease.NewElector(l, "gocron-leader")
		require.NoError(t, err)
		return e
	}
	leader, follower := elector("a"), elector("b")

	require.NoError(t, leader.IsLeader(ctx))
	require.NoError(t, leader.IsLeader(ctx), "still leading: no new election")
	require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
	assert.Equal(t, 1.0, value(t, reg, "pglease_elections_total", nil))
	require.NoError(t, leader.Close(ctx))
	require.NoError(t, follower.IsLeader(ctx))
	assert.Equal(t, 2.0, value(t, reg, "pglease_elections_total", nil))
}

func TestTicksAreCountedRanSkippedAndCaughtUp(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	const period = time.Second
	job := func(name string) *pglease.JobLocker {
		j, err := pgtest.Locker(t, pool, table, name, pglease.WithHook(m.Hook)).Job(pglease.WithPeriod(period))
		require.NoError(t, err)
		return j
	}
	a, b := job("a"), job("b")
	time.Sleep(time.Until(time.Now().Truncate(period).Add(period + period/10)))
	run, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld, "the same tick: held, not skipped")
	time.Sleep(time.Until(run.(*pglease.Lease).Tick().Add(period)))
	_, err = b.Lock(ctx, "job")
	require.ErrorIs(t, err, pglease.ErrHeld, "the next tick while the run holds the key: skipped")
	require.NoError(t, run.Unlock(ctx))
	m.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "other", Holder: "c", Fence: 9, Tick: time.Now(), CaughtUp: true})

	assert.Equal(t, 1.0, value(t, reg, "pglease_ticks_total", outcome("ran")))
	assert.Equal(t, 1.0, value(t, reg, "pglease_ticks_total", outcome("skipped")))
	assert.Equal(t, 1.0, value(t, reg, "pglease_ticks_total", outcome("caught_up")))
	assert.Equal(t, 2.0, value(t, reg, "pglease_claims_total", outcome("held")))
}

func TestUnknownEventKindsChangeNoSeries(t *testing.T) {
	t.Parallel()
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	m.Hook(pglease.Event{Kind: pglease.EventKind(99), Key: "job", Holder: "a", Fence: 1, Took: time.Second})
	families, err := reg.Gather()
	require.NoError(t, err)
	n := 0
	for _, f := range families {
		for _, s := range f.GetMetric() {
			n++
			assert.Zero(t, s.GetCounter().GetValue()+s.GetGauge().GetValue()+float64(s.GetHistogram().GetSampleCount()),
				"%s%v", f.GetName(), s.GetLabel())
		}
	}
	assert.Equal(t, 16, n, "3 claim outcomes, 3 release outcomes, 3 tick outcomes, held, lost, heartbeat latency and failures, elections, clock skew and its uncertainty")
}

func TestClockSkewGaugesFollowTheSkewReadingOfEachClaim(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	assert.Zero(t, value(t, reg, "pglease_clock_skew_seconds", nil), "0 until the first claim")

	l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(m.Hook))
	_, err := l.Claim(ctx, "job")
	require.NoError(t, err)
	skew, ok := l.ClockSkew()
	require.True(t, ok)
	assert.Equal(t, skew.Offset.Seconds(), value(t, reg, "pglease_clock_skew_seconds", nil))
	assert.Equal(t, skew.Uncertainty.Seconds(), value(t, reg, "pglease_clock_skew_uncertainty_seconds", nil))
	assert.Positive(t, value(t, reg, "pglease_clock_skew_uncertainty_seconds", nil))

	m.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "other", Fence: 1,
		Skew: pglease.Skew{Offset: -2 * time.Second, Uncertainty: time.Millisecond, At: time.Now()}})
	assert.Equal(t, -2.0, value(t, reg, "pglease_clock_skew_seconds", nil))
	assert.Equal(t, 0.001, value(t, reg, "pglease_clock_skew_uncertainty_seconds", nil))
	m.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "no-reading", Fence: 2})
	assert.Equal(t, -2.0, value(t, reg, "pglease_clock_skew_seconds", nil), "an event without a reading leaves the gauge")

	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)
}

func TestLeasesHeldGaugeReturnsToZeroWhenCloseOvertakesClaimsInFlight(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	m, reg := newMetrics(t, pgleaseprom.Opts{})
	l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(m.Hook))

	var wg sync.WaitGroup
	started := make(chan struct{}, 50)
	for i := range 50 {
		wg.Go(func() {
			started <- struct{}{}
			_, _ = l.Claim(ctx, fmt.Sprintf("job%d", i)) // some win, some are overtaken by Close
		})
	}
	for range 25 {
		<-started
	}
	require.NoError(t, l.Close(ctx))
	wg.Wait()
	acquired := value(t, reg, "pglease_claims_total", outcome("acquired"))
	t.Logf("%v of 50 claims acquired before or while Close ran", acquired)
	assert.Equal(t, 0.0, value(t, reg, "pglease_leases_held", nil),
		"every lease, those Close gave back right after their claim included, ended after it began")
	assert.Equal(t, acquired, value(t, reg, "pglease_releases_total", outcome("released")))
}
