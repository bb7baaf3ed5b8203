package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

func TestRowLockedPastTheTrustWindowLosesOnlyThatLease(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const ttl = time.Second
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
	locked, err := l.Claim(ctx, "locked")
	require.NoError(t, err)
	var others []*pglease.Lease
	for _, key := range []string{"b", "c"} {
		lease, err := l.Claim(ctx, key)
		require.NoError(t, err)
		others = append(others, lease)
	}
	extendedPast := func(lease *pglease.Lease, limit time.Duration) {
		t.Helper()
		from := lease.ExpiresAt()
		require.Eventually(t, func() bool { return lease.ExpiresAt().After(from) }, limit, 5*time.Millisecond,
			"lease %q extended", lease.Key())
	}

	// A lock shorter than the trust window: the row is skipped, retried,
	// and extended again once free; nothing is lost.
	end := lockRow(t, pool, table, "locked")
	lockedUntil := locked.ExpiresAt()
	for range 3 {
		extendedPast(others[0], ttl)
	}
	require.NoError(t, locked.Err(), "a locked row is not a lost one")
	assert.Equal(t, lockedUntil, locked.ExpiresAt(), "the locked row is skipped, not waited for")
	end(false)
	extendedPast(locked, ttl)

	// A lock past the trust window: that lease alone is lost.
	end = lockRow(t, pool, table, "locked")
	pgtest.WaitDone(t, locked, 2*ttl)
	require.ErrorIs(t, locked.Err(), pglease.ErrLost)
	for _, lease := range others {
		require.NoError(t, lease.Err(), "lease %q of the same Locker", lease.Key())
		extendedPast(lease, ttl)
	}
	end(false)
	for _, lease := range others {
		extendedPast(lease, ttl)
		require.NoError(t, lease.Err())
	}
	assert.Equal(t, 1, events.Count(pglease.EventLost))
}

func TestLeasesOfAnotherLockerLockedByItsClaimAreNotLostButRetried(t *testing.T) {
	t.Parallel()
	ctx, pool, table, counter := pgtest.SetupCounted(t)
	events := pgtest.NewEvents(t)
	const interval = 50 * time.Millisecond
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(interval), pglease.WithHook(events.Hook))
	var leases []*pglease.Lease
	for i := range 10 {
		lease, err := l.Claim(ctx, fmt.Sprintf("k%d", i))
		require.NoError(t, err)
		leases = append(leases, lease)
	}
	// Other replicas try the same keys all the time, as gocron's replicas
	// do at every tick: each claim locks the row it finds held.
	others := pgtest.Locker(t, pool, table, "b")
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := w; ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := others.Claim(ctx, fmt.Sprintf("k%d", i%10))
				if !errors.Is(err, pglease.ErrHeld) {
					t.Errorf("claim of a held key: %v", err)
					return
				}
			}
		})
	}
	counter.Reset()
	time.Sleep(2 * time.Second) // the scenario: two seconds of claims contending with the rounds
	close(stop)
	wg.Wait()
	for _, lease := range leases {
		require.NoError(t, lease.Err())
	}
	rounds := events.Count(pglease.EventExtended) + events.Count(pglease.EventHeartbeatFailed)
	t.Logf("figures: 2 s of claims contending with 10 leases: %d rounds (interval %v), %d heartbeat statements, %d claims",
		rounds, interval, counter.Count("heartbeat"), counter.Count("claim"))
	assert.InDelta(t, rounds, counter.Count("heartbeat"), 2, "one statement per round")
	assert.Zero(t, counter.Count("other"))
}

// syncSpyDB runs every heartbeat statement once more in a transaction it
// rolls back, under a given synchronous_commit, and records the setting the
// statement leaves for the commit.
type syncSpyDB struct {
	pglease.DB
	pool     pglease.DB
	setting  string
	mu       sync.Mutex
	atCommit []string
}

func (s *syncSpyDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pgtest.StatementKind(sql) == "heartbeat" {
		if err := s.spy(ctx, sql, args); err != nil {
			return nil, fmt.Errorf("spy: %w", err)
		}
	}
	return s.DB.Query(ctx, sql, args...)
}

func (s *syncSpyDB) spy(ctx context.Context, sql string, args []any) error {
	tx, err := s.pool.Begin(ctx)
	if err != nil {
		return err
	}
	defer func() { _ = tx.Rollback(context.Background()) }()
	if _, err := tx.Exec(ctx, "SELECT set_config('synchronous_commit', $1, true)", s.setting); err != nil {
		return err
	}
	rows, err := tx.Query(ctx, sql, args...)
	if err != nil {
		return err
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return err
	}
	var got string
	if err := tx.QueryRow(ctx, "SELECT current_setting('synchronous_commit')").Scan(&got); err != nil {
		return err
	}
	s.mu.Lock()
	s.atCommit = append(s.atCommit, got)
	s.mu.Unlock()
	return nil
}

func TestHeartbeatCommitsSynchronouslyWhateverTheDefaultAndNeverWeakensIt(t *testing.T) {
	t.Parallel()
	for _, mode := range []string{"fenced", "without fence column"} {
		t.Run(mode, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			pool, table, opts := leaseTable(t, mode == "fenced")
			opts = append(opts, pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(20*time.Millisecond))
			for setting, want := range map[string]string{
				"off": "on", "local": "on", "remote_write": "remote_write", "on": "on", "remote_apply": "remote_apply",
			} {
				events := pgtest.NewEvents(t)
				spy := &syncSpyDB{DB: pool, pool: pool, setting: setting}
				l := pgtest.Locker(t, spy, table, "a-"+setting, append(opts, pglease.WithHook(events.Hook))...)
				_, err := l.Claim(ctx, "k-"+setting)
				require.NoError(t, err)
				ev := events.WaitFor(t, pglease.EventExtended, 5*time.Second)
				require.Equal(t, 1, ev.Leases)
				require.NoError(t, l.Close(ctx))
				spy.mu.Lock()
				require.NotEmpty(t, spy.atCommit)
				assert.Equal(t, want, spy.atCommit[0], "synchronous_commit at commit when the default is %s", setting)
				spy.mu.Unlock()
			}
		})
	}
}

func TestServerClockSteppedBackFailsNoStatementAndCostsNoOtherLease(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const ttl = 2 * time.Second
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(50*time.Millisecond),
		pglease.WithMinHold(0), pglease.WithHook(events.Hook))
	stepped, err := l.Claim(ctx, "stepped")
	require.NoError(t, err)
	other, err := l.Claim(ctx, "other")
	require.NoError(t, err)

	// The row as the claim wrote it before the server's clock stepped back
	// an hour: acquired_at and expires_at lie an hour in the server's future.
	_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET acquired_at = clock_timestamp() + interval '1 hour',
		expires_at = clock_timestamp() + interval '1 hour' + make_interval(secs => $1) WHERE key = 'stepped'`,
		pgx.Identifier{table}.Sanitize()), ttl.Seconds())
	require.NoError(t, err)

	before := events.Count(pglease.EventExtended)
	from := other.ExpiresAt()
	require.Eventually(t, func() bool { return events.Count(pglease.EventExtended) >= before+5 }, 5*time.Second, 5*time.Millisecond)
	for _, ev := range eventsOf(events, pglease.EventHeartbeatFailed) {
		var pgErr *pgconn.PgError
		require.False(t, errors.As(ev.Err, &pgErr) && pgErr.Code == "23514", "CHECK violation: %v", ev.Err)
		t.Fatalf("heartbeat failed: %v", ev.Err)
	}
	require.NoError(t, other.Err())
	require.NoError(t, stepped.Err())
	assert.True(t, other.ExpiresAt().After(from), "the other lease is extended in the same rounds")

	require.NoError(t, stepped.Unlock(ctx), "release after the step")
	row, _ := pgtest.ReadRow(t, pool, table, "stepped")
	assert.True(t, row.ExpiresAt.After(row.AcquiredAt))
	require.NoError(t, other.Unlock(ctx))
}

// eventsOf returns the events of kind logged so far.
func eventsOf(e *pgtest.Events, kind pglease.EventKind) []pglease.Event {
	var out []pglease.Event
	for _, ev := range e.All() {
		if ev.Kind == kind {
			out = append(out, ev)
		}
	}
	return out
}

// slowDB delays every heartbeat statement by a fixed time before sending it,
// as a slow network or a loaded server would, and records when each started.
type slowDB struct {
	pglease.DB
	delay  time.Duration
	mu     sync.Mutex
	starts []time.Time
}

func (s *slowDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if pgtest.StatementKind(sql) == "heartbeat" {
		s.mu.Lock()
		s.starts = append(s.starts, time.Now())
		s.mu.Unlock()
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return s.DB.Query(ctx, sql, args...)
}

func (s *slowDB) started() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.starts)
}

func TestSlowHeartbeatRoundsKeepTheirPeriodAndLoseNothing(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	// Each round takes 3/4 of the interval. Timed from its end, a round
	// would start every 1.4 s and its reply would come 2 s after the
	// previous one was sent: past the trust window (2 s - 200 ms).
	const ttl, interval, delay = 2 * time.Second, 800 * time.Millisecond, 600 * time.Millisecond
	db := &slowDB{DB: pool, delay: delay}
	l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval))
	lease, err := l.Claim(ctx, "k")
	require.NoError(t, err)

	const window = 5 * interval
	select {
	case <-lease.Done():
		t.Fatalf("lease lost although every round succeeds: %v", lease.Err())
	case <-time.After(window):
	}
	require.NoError(t, lease.Err())
	rounds := db.started()
	t.Logf("figures: %d rounds started in %v (interval %v, each round %v)", rounds, window, interval, delay)
	assert.GreaterOrEqual(t, rounds, 4, "rounds start every interval, however long they take")
}
