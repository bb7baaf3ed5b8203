package pgleaseotel_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseotel"
)

// lapse waits for lease to end, as its heartbeat finds it lost.
func lapse(t *testing.T, lease *pglease.Lease) {
	t.Helper()
	select {
	case <-lease.Done():
	case <-time.After(10 * time.Second):
		t.Fatalf("lease %q was not found lost", lease.Key())
	}
}

func TestMetrics(t *testing.T) {
	t.Parallel()

	t.Run("Claims", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		assert.Zero(t, tel.sum(t, "pglease.claims", outcome("failed")), "every outcome is exported at zero from the start")
		assert.Zero(t, tel.sum(t, "pglease.leases.held"))

		a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(tel.Hook))
		noTable := pgtest.Locker(t, pool, pgtest.TableName(), "c", pglease.WithHook(tel.Hook))
		_, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		for range 2 {
			_, err = b.Claim(ctx, "job")
			require.ErrorIs(t, err, pglease.ErrHeld)
		}
		_, err = noTable.Claim(ctx, "job")
		require.Error(t, err, "the table does not exist")

		assert.Equal(t, int64(1), tel.sum(t, "pglease.claims", outcome("acquired")))
		assert.Equal(t, int64(2), tel.sum(t, "pglease.claims", outcome("held")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.claims", outcome("failed"), errorType("42P01")),
			"a failed claim says its SQLSTATE: undefined_table")
		assert.Equal(t, int64(1), tel.sum(t, "pglease.leases.held"))
		m, ok := tel.metric(t, "pglease.claims")
		require.True(t, ok)
		assert.Equal(t, "{claim}", m.Unit)
	})

	t.Run("LeasesHeld", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook),
			pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		held := func() int64 { return tel.sum(t, "pglease.leases.held") }

		leases := map[string]*pglease.Lease{}
		for _, key := range []string{"k1", "k2", "k3", "k4"} {
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			leases[key] = lease
		}
		assert.Equal(t, int64(4), held())
		require.NoError(t, leases["k1"].Unlock(ctx))
		assert.Equal(t, int64(3), held())
		assert.Equal(t, int64(1), tel.sum(t, "pglease.releases", outcome("released")))

		// k2's row taken behind the Locker's back: lost at the next heartbeat.
		_, err := pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = 'thief' WHERE key = 'k2'`, pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)
		lapse(t, leases["k2"])
		require.ErrorIs(t, leases["k2"].Err(), pglease.ErrLost)
		assert.Equal(t, int64(1), tel.sum(t, "pglease.leases.lost", errorType("lost")))
		assert.Equal(t, int64(2), held())

		// Unlocking the lost lease is a release outcome, not a second
		// decrement.
		require.ErrorIs(t, leases["k2"].Unlock(ctx), pglease.ErrLost)
		assert.Equal(t, int64(1), tel.sum(t, "pglease.releases", outcome("lost")))
		assert.Equal(t, int64(2), held())

		// k3 revoked by an operator: a loss of its own cause.
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		_, err = admin.Revoke(ctx, "k3")
		require.NoError(t, err)
		lapse(t, leases["k3"])
		require.ErrorIs(t, leases["k3"].Err(), pglease.ErrRevoked)
		assert.Equal(t, int64(1), tel.sum(t, "pglease.leases.lost", errorType("revoked")))
		assert.Equal(t, int64(1), held(), "k4 is still held")

		require.NoError(t, l.Close(ctx))
		assert.Equal(t, int64(0), held())
		assert.Equal(t, int64(2), tel.sum(t, "pglease.releases", outcome("released")), "k1, then k4 by Close")
		assert.Zero(t, tel.sum(t, "pglease.releases", outcome("failed")))
	})

	t.Run("LostThenUnlocked", func(t *testing.T) {
		t.Parallel()
		tel := newTelemetry(t, pgleaseotel.Opts{})
		ev := func(kind pglease.EventKind, holder string, fence int64) pglease.Event {
			e := pglease.Event{Kind: kind, Key: "job", Holder: holder, Fence: fence}
			if kind == pglease.EventLost || kind == pglease.EventReleaseFailed {
				e.Err = fmt.Errorf("unlock: %w", pglease.ErrLost)
			}
			return e
		}
		for f := int64(1); f <= 100; f++ {
			tel.Hook(ev(pglease.EventAcquired, "a", f))
			tel.Hook(ev(pglease.EventLost, "a", f))
			tel.Hook(ev(pglease.EventReleaseFailed, "a", f))
		}
		tel.Hook(ev(pglease.EventClaimFailed, "a", 200)) // a row but no lease: never counted
		assert.Equal(t, int64(0), tel.sum(t, "pglease.leases.held"))
		tel.Hook(ev(pglease.EventAcquired, "a", 300))
		tel.Hook(ev(pglease.EventAcquired, "b", 300)) // the same key and fence from another holder is another lease
		tel.Hook(ev(pglease.EventReleased, "a", 300))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.leases.held"))
		assert.Equal(t, int64(100), tel.sum(t, "pglease.releases", outcome("lost")))
		assert.Equal(t, int64(100), tel.sum(t, "pglease.leases.lost", errorType("lost")))
	})

	t.Run("Heartbeat", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		db := pgtest.NewFaultyDB(pool)
		l := pgtest.Locker(t, db, table, "a", pglease.WithHook(tel.Hook),
			pglease.WithTTL(5*time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		rounds := func(attrs ...attribute.KeyValue) int64 {
			n, _ := tel.lookup("pglease.heartbeat.rounds", attrs...)
			return n
		}
		require.Eventually(t, func() bool { return rounds(outcome("extended")) >= 3 },
			10*time.Second, 10*time.Millisecond, "three heartbeat rounds are counted")
		h := tel.histogram(t, "pglease.heartbeat.duration", outcome("extended"))
		assert.GreaterOrEqual(t, h.Count, uint64(3))
		assert.Positive(t, h.Sum, "each round's round trip took some time")
		m, _ := tel.metric(t, "pglease.heartbeat.duration")
		assert.Equal(t, "s", m.Unit)

		db.SetFail("heartbeat", errors.New("injected heartbeat failure"))
		require.Eventually(t, func() bool { return rounds(outcome("failed"), errorType("_OTHER")) >= 2 },
			10*time.Second, 10*time.Millisecond, "failed rounds are counted by error.type")
		db.SetFail("heartbeat", nil)
		require.NoError(t, lease.Err(), "an outage shorter than the TTL loses nothing")
	})

	t.Run("GuardRefusals", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tel.Guard(ctx, lease, tx))
		require.NoError(t, tx.Commit(ctx))
		_, ok := tel.metric(t, "pglease.guard.refusals")
		assert.False(t, ok, "a guard that passes refuses nothing")

		require.NoError(t, lease.Unlock(ctx))
		tx, err = pool.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, tel.Guard(ctx, lease, tx), pglease.ErrLost)
		require.Error(t, tx.Commit(ctx), "the refused transaction rolls back")
		assert.Equal(t, int64(1), tel.sum(t, "pglease.guard.refusals", errorType("lost")))
	})

	t.Run("ClaimWait", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(tel.Hook))
		first, err := a.Claim(ctx, "job")
		require.NoError(t, err)

		got := make(chan error, 1)
		go func() {
			lease, err := tel.ClaimWait(ctx, b, "job")
			if err == nil && lease.Holder() != b.Holder() {
				err = fmt.Errorf("lease of %q", lease.Holder())
			}
			got <- err
		}()
		require.Eventually(t, func() bool {
			n, ok := tel.lookup("pglease.claim_wait.active")
			return ok && n == 1
		}, 10*time.Second, 5*time.Millisecond, "the waiting claim is counted while it waits")
		time.Sleep(50 * time.Millisecond) // a wait of at least this long
		require.NoError(t, first.Unlock(ctx))
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting claim did not get the released key")
		}
		assert.Equal(t, int64(0), tel.sum(t, "pglease.claim_wait.active"))
		h := tel.histogram(t, "pglease.claim_wait.duration", outcome("acquired"))
		assert.Equal(t, uint64(1), h.Count)
		assert.GreaterOrEqual(t, h.Sum, 0.05, "the claim waited for the release")

		short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		defer cancel()
		_, err = tel.ClaimWait(short, a, "job")
		require.ErrorIs(t, err, context.DeadlineExceeded)
		assert.Equal(t, uint64(1), tel.histogram(t, "pglease.claim_wait.duration", outcome("failed"), errorType("timeout")).Count)
	})

	t.Run("Handover", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		elector := func(holder string) *pglease.Elector {
			l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(holder),
				pglease.WithHook(tel.Hook), pglease.WithLogger(slog.New(slog.DiscardHandler)))
			t.Cleanup(func() { _ = l.Close(context.Background()) })
			e, err := pglease.NewElector(l, "gocron-leader")
			require.NoError(t, err)
			return e
		}
		leader, follower := elector("a"), elector("b")
		require.NoError(t, leader.IsLeader(ctx))
		require.ErrorIs(t, follower.IsLeader(ctx), pglease.ErrHeld)
		assert.Equal(t, int64(1), tel.sum(t, "pglease.elector.elections"))
		_, ok := tel.metric(t, "pglease.elector.handover.duration")
		assert.False(t, ok, "the first election hands nothing over")

		require.NoError(t, leader.Close(ctx))
		lease, err := tel.Campaign(ctx, follower) // its campaign, started by IsLeader, may have won already
		require.NoError(t, err)
		assert.True(t, strings.HasPrefix(lease.Holder(), "b#"), "the follower leads: %q", lease.Holder())
		assert.Equal(t, int64(2), tel.sum(t, "pglease.elector.elections"))
		h := tel.histogram(t, "pglease.elector.handover.duration")
		assert.Equal(t, uint64(1), h.Count)
		assert.Less(t, h.Sum, (60 * time.Second).Seconds(), "a resignation hands over at once, not at the expiry")
		assert.Equal(t, uint64(1), tel.histogram(t, "pglease.claim_wait.duration", outcome("acquired")).Count)
	})

	t.Run("HandoverOrder", func(t *testing.T) {
		t.Parallel()
		tel := newTelemetry(t, pgleaseotel.Opts{})
		ev := func(kind pglease.EventKind, holder string, fence int64) pglease.Event {
			return pglease.Event{Kind: kind, Key: "leader", Holder: holder, Fence: fence}
		}
		tel.Hook(ev(pglease.EventElected, "a", 1))
		// b's election is reported before the end of a's leadership: the
		// key had its next leader at once.
		tel.Hook(ev(pglease.EventElected, "b", 2))
		tel.Hook(ev(pglease.EventStoppedLeading, "a", 1))
		h := tel.histogram(t, "pglease.elector.handover.duration")
		assert.Equal(t, uint64(1), h.Count)
		assert.Zero(t, h.Sum)

		// b's end, then a wait, then a's election: a real vacancy.
		tel.Hook(ev(pglease.EventStoppedLeading, "b", 2))
		time.Sleep(20 * time.Millisecond)            // a vacancy of at least this long
		tel.Hook(ev(pglease.EventNewLeader, "b", 0)) // another Elector's first sight of the old leader closes nothing
		tel.Hook(ev(pglease.EventElected, "a", 3))
		h = tel.histogram(t, "pglease.elector.handover.duration")
		assert.Equal(t, uint64(2), h.Count)
		assert.GreaterOrEqual(t, h.Sum, 0.02)
		tel.Hook(ev(pglease.EventNewLeader, "a", 0))
		assert.Equal(t, uint64(2), tel.histogram(t, "pglease.elector.handover.duration").Count, "one handover, however many events report its new leader")
		assert.Equal(t, int64(3), tel.sum(t, "pglease.elector.elections"))
	})

	t.Run("Ticks", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		assert.Zero(t, tel.sum(t, "pglease.ticks", outcome("skipped")), "every outcome is exported at zero from the start")
		const period = time.Second
		job := func(name string) *pglease.JobLocker {
			j, err := pgtest.Locker(t, pool, table, name, pglease.WithHook(tel.Hook)).Job(pglease.WithPeriod(period))
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
		tel.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "other", Holder: "c", Fence: 9, Tick: time.Now(), CaughtUp: true})

		assert.Equal(t, int64(1), tel.sum(t, "pglease.ticks", outcome("ran")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.ticks", outcome("skipped")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.ticks", outcome("caught_up")))
	})

	t.Run("ClockSkew", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{})
		_, ok := tel.metric(t, "pglease.clock.skew")
		assert.False(t, ok, "no reading before the first claim")
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		_, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		skew, ok := l.ClockSkew()
		require.True(t, ok)
		assert.Equal(t, skew.Offset.Seconds(), tel.gauge(t, "pglease.clock.skew"))
		assert.Equal(t, skew.Uncertainty.Seconds(), tel.gauge(t, "pglease.clock.skew.uncertainty"))
		assert.Positive(t, tel.gauge(t, "pglease.clock.skew.uncertainty"))

		tel.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "other", Fence: 1,
			Skew: pglease.Skew{Offset: -2 * time.Second, Uncertainty: time.Millisecond, At: time.Now()}})
		assert.Equal(t, -2.0, tel.gauge(t, "pglease.clock.skew"))
		tel.Hook(pglease.Event{Kind: pglease.EventAcquired, Key: "no-reading", Fence: 2})
		assert.Equal(t, -2.0, tel.gauge(t, "pglease.clock.skew"), "an event without a reading leaves the gauge")
	})

	t.Run("PerKey", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{PerKey: true})
		a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(tel.Hook))
		key := func(k string) attribute.KeyValue { return attribute.String("pglease.key", k) }
		alpha, err := a.Claim(ctx, "alpha")
		require.NoError(t, err)
		_, err = a.Claim(ctx, "beta")
		require.NoError(t, err)
		_, err = b.Claim(ctx, "alpha")
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.NoError(t, alpha.Unlock(ctx))

		assert.Equal(t, int64(1), tel.sum(t, "pglease.claims", outcome("acquired"), key("alpha")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.claims", outcome("held"), key("alpha")))
		assert.Equal(t, int64(0), tel.sum(t, "pglease.leases.held", key("alpha")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.leases.held", key("beta")))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.releases", outcome("released"), key("alpha")))
	})
}
