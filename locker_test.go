package pglease_test

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestLocker pins the Locker's own surface: what its constructors accept.
func TestLocker(t *testing.T) {
	t.Parallel()
	// A Locker's statements must each commit on their own: on a pgx.Tx (which
	// satisfies DB), a claim would live or die with the caller's transaction,
	// and a rollback would let another holder in while the Locker trusts the
	// lease; a release would turn synchronous_commit off for the rest of the
	// caller's transaction. NewLocker and NewElector refuse one, naming it.
	t.Run("RefusesATransaction", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		defer conn.Close(context.Background())
		tx, err := conn.Begin(ctx)
		require.NoError(t, err)
		defer func() { _ = tx.Rollback(context.Background()) }()

		const want = "pglease: new locker: db is a pgx.Tx: a Locker needs a pool or a connection, each statement committing on its own"
		_, err = pglease.New(tx)
		require.EqualError(t, err, want)
		require.PanicsWithError(t, want, func() { pglease.NewLocker(tx) })
	})
}

// lockedBuffer collects a Locker's log lines, safe for concurrent writes.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func (b *lockedBuffer) count(s string) int {
	return strings.Count(b.String(), s)
}

const (
	skewWarning = "clock skew against the database beyond the bound"
	skewBack    = "clock skew against the database back within the bound"
)

// TestClockSkew pins Locker.ClockSkew and its warning: the reading shows a
// replica's shifted clock and follows a step through heartbeat rounds, and
// the warning fires once per crossing of its bound.
//
// The server and the tests share one host clock, so the true skew is zero;
// ShiftWallClock (export_test.go) offsets only the Locker's wall clock, as
// a replica whose clock is off would be, while its monotonic clock, and so
// the round trips, stay true.
func TestClockSkew(t *testing.T) {
	t.Parallel()

	// A heartbeat round's sample is the server's clock as the round ran,
	// whatever the rows' expiries: a row whose expiry is beyond now + TTL
	// without any clock step (an operator extended it by an hour before a
	// deploy) must not make the Locker report the server an hour ahead.
	t.Run("IgnoresAnExpiryTheRoundDidNotMove", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(3*time.Second), pglease.WithHook(events.Hook))

		_, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		_, err = pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s SET expires_at = expires_at + interval '1 hour' WHERE key = 'k'`,
			pgx.Identifier{table}.Sanitize()))
		require.NoError(t, err)

		require.Eventually(t, func() bool {
			for _, e := range events.All() {
				if e.Kind == pglease.EventExtended && !e.Skew.At.IsZero() && e.Leases == 1 {
					return true
				}
			}
			return false
		}, 10*time.Second, 20*time.Millisecond)
		skew, ok := l.ClockSkew()
		require.True(t, ok)
		require.Less(t, skew.Beyond(), time.Second, "the reading says the server is %v ahead (± %v); its clock never moved", skew.Offset, skew.Uncertainty)
	})

	// Guarantee: ClockSkew shows a shifted replica clock, and warns once per
	// crossing of half the min hold.
	t.Run("WarnsOncePerCrossingOfHalfTheMinHold", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		logs := &lockedBuffer{}
		var (
			mu       sync.Mutex
			acquired []pglease.Event
		)
		l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("skewed"),
			pglease.WithTTL(10*time.Second), pglease.WithMinHold(time.Second),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventAcquired {
					mu.Lock()
					acquired = append(acquired, e)
					mu.Unlock()
				}
			})))
		t.Cleanup(func() { _ = l.Close(ctx) })
		claim := func(key string) pglease.Skew {
			t.Helper()
			_, err := l.Claim(ctx, key)
			require.NoError(t, err)
			s, ok := l.ClockSkew()
			require.True(t, ok)
			mu.Lock()
			defer mu.Unlock()
			assert.Equal(t, s, acquired[len(acquired)-1].Skew, "the event carries the reading")
			return s
		}
		_, ok := l.ClockSkew()
		assert.False(t, ok, "no reading before the first claim")

		s := claim("k0")
		assert.Positive(t, s.Uncertainty, "half a round trip")
		assert.LessOrEqual(t, s.Beyond(), 10*time.Millisecond, "one clock: no skew beyond the uncertainty, got %+v", s)
		assert.Zero(t, logs.count(skewWarning))

		const shift = 3 * time.Second // beyond half the min hold (500ms)
		pglease.ShiftWallClock(l, shift)
		for i := range 3 {
			s = claim(fmt.Sprintf("k%d", i+1))
			assert.InDelta(t, float64(-shift), float64(s.Offset), float64(s.Uncertainty+10*time.Millisecond),
				"a replica clock %v ahead reads as the server %v behind: %+v", shift, shift, s)
		}
		assert.Equal(t, 1, logs.count(skewWarning), "warned once, not per claim:\n%s", logs.String())
		assert.Contains(t, logs.String(), "bound=500ms")

		pglease.ShiftWallClock(l, 0)
		s = claim("k4")
		assert.LessOrEqual(t, s.Beyond(), 10*time.Millisecond, "the reading follows a clock step at once: %+v", s)
		assert.Equal(t, 1, logs.count(skewBack))
		claim("k5")
		assert.Equal(t, 1, logs.count(skewWarning))
		assert.Equal(t, 1, logs.count(skewBack))

		pglease.ShiftWallClock(l, -shift)
		s = claim("k6")
		assert.InDelta(t, float64(shift), float64(s.Offset), float64(s.Uncertainty+10*time.Millisecond), "%+v", s)
		assert.Equal(t, 2, logs.count(skewWarning), "a new crossing warns again")
	})

	// Guarantee: without a min hold, clock skew warns beyond one second.
	t.Run("WithoutMinHoldWarnsBeyondOneSecond", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		logs := &lockedBuffer{}
		l := pgtest.Locker(t, pool, table, "skewed",
			pglease.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))))

		pglease.ShiftWallClock(l, 500*time.Millisecond)
		_, err := l.Claim(ctx, "a")
		require.NoError(t, err)
		assert.Zero(t, logs.count(skewWarning), "half a second is within a second")

		pglease.ShiftWallClock(l, -2*time.Second)
		_, err = l.Claim(ctx, "b")
		require.NoError(t, err)
		assert.Equal(t, 1, logs.count(skewWarning))
		assert.Contains(t, logs.String(), "bound=1s")
	})

	// A replica's clock that steps while it holds a lease and claims nothing
	// (an Elector's leader, a long job) shows in the reading through the
	// heartbeat rounds, each of which returns a server time (the new expiry
	// less the lease's TTL), and the warning fires.
	t.Run("FollowsAStepThroughHeartbeatRounds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		logs := &lockedBuffer{}
		extended := make(chan pglease.Skew, 100)
		l := pgtest.Each(pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("leader"),
			pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithMinHold(400*time.Millisecond),
			pglease.WithLogger(slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))),
			pglease.WithHook(func(e pglease.Event) {
				if e.Kind == pglease.EventExtended {
					select {
					case extended <- e.Skew:
					default:
					}
				}
			})))
		t.Cleanup(func() { _ = l.Close(ctx) })
		_, err := l.Claim(ctx, "leadership")
		require.NoError(t, err)
		before, ok := l.ClockSkew()
		require.True(t, ok)
		require.Less(t, before.Beyond(), 200*time.Millisecond, "no skew before the step: %+v", before)

		// The replica's clock steps back (ahead, past the trust deadline, it
		// would end the lease as after a suspend).
		const step = -3 * time.Second
		pglease.ShiftWallClock(l, step)
		deadline := time.After(10 * time.Second)
		for {
			select {
			case s := <-extended:
				if (s.Offset + step).Abs() <= s.Uncertainty+10*time.Millisecond {
					got, ok := l.ClockSkew()
					require.True(t, ok)
					assert.Equal(t, s, got, "the round's event carries the reading")
					assert.Equal(t, 1, logs.count(skewWarning), "one warning for the crossing")
					return
				}
			case <-deadline:
				t.Fatalf("no heartbeat round showed the step of %v; reading %+v", step, func() pglease.Skew { s, _ := l.ClockSkew(); return s }())
			}
		}
	})
}
