package faults_test

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// The tests of this file step the server's clock for real: the private
// server runs under libfaketime (apt-get install faketime libfaketime),
// which reads its offset from a file on every clock reading.

const libfaketime = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1"

// fakeClock is a private server whose wall clock can be stepped.
type fakeClock struct {
	srv  *pgserver.Server
	file string
}

func startFakeClockServer(t *testing.T) *fakeClock {
	t.Helper()
	if _, err := os.Stat(libfaketime); err != nil {
		t.Fatalf("libfaketime is needed: apt-get install -y faketime libfaketime: %v", err)
	}
	dir, err := os.MkdirTemp("", "pglease-faketime") //nolint:usetesting // the postgres user reads it: t.TempDir is under a root-only parent
	require.NoError(t, err)
	require.NoError(t, os.Chmod(dir, 0o755))
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	fc := &fakeClock{file: filepath.Join(dir, "faketime.rc")}
	fc.step(t, 0)
	t.Setenv("LD_PRELOAD", libfaketime)
	t.Setenv("FAKETIME_TIMESTAMP_FILE", fc.file)
	t.Setenv("FAKETIME_NO_CACHE", "1")
	t.Setenv("FAKETIME_DONT_FAKE_MONOTONIC", "1")
	srv, err := pgserver.Start(pgtest.Ctx(t), pgserver.Options{Private: true})
	require.NoError(t, err)
	t.Cleanup(func() { _ = srv.Close() })
	fc.srv = srv
	return fc
}

// step sets the server's clock to real time + offset.
func (fc *fakeClock) step(t *testing.T, offset time.Duration) {
	t.Helper()
	tmp := fc.file + ".tmp"
	require.NoError(t, os.WriteFile(tmp, []byte(fmt.Sprintf("%+ds\n", int64(offset/time.Second))), 0o644))
	require.NoError(t, os.Rename(tmp, fc.file))
}

func serverNow(t *testing.T, db pglease.DB) time.Time {
	t.Helper()
	var now time.Time
	require.NoError(t, db.QueryRow(context.Background(), `SELECT clock_timestamp()`).Scan(&now))
	return now
}

func waitAdvisoryWaiter(t *testing.T, pool *pgxpool.Pool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		var n int
		require.NoError(t, pool.QueryRow(context.Background(),
			`SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted`).Scan(&n))
		if n > 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Fatal("the stalled claim never waited on the advisory lock")
}

// TestServerClock steps a private server's clock (libfaketime) under a
// running Locker: no statement fails, and a step costs at most one
// heartbeat and never a fence.
func TestServerClock(t *testing.T) {
	t.Run("FakeClockReallySteps", func(t *testing.T) {
		fc := startFakeClockServer(t)
		pool := pgtest.PoolAt(t, fc.srv.DSN(), nil)
		before := serverNow(t, pool)
		require.WithinDuration(t, time.Now(), before, 5*time.Second)
		fc.step(t, 2*time.Hour)
		require.WithinDuration(t, time.Now().Add(2*time.Hour), serverNow(t, pool), 5*time.Second)
		fc.step(t, -time.Hour)
		require.WithinDuration(t, time.Now().Add(-time.Hour), serverNow(t, pool), 5*time.Second)
	})

	// Guarantee: no statement fails its CHECK (SQLSTATE 23514) and a
	// lease is neither lost nor doubled when the server's clock steps back, then
	// forward again, while leases are claimed, extended and released.
	t.Run("StepsNeverFailAStatement", func(t *testing.T) {
		fc := startFakeClockServer(t)
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolAt(t, fc.srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		events := pgtest.NewEvents(t)
		const ttl = 2 * time.Second
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHook(events.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl))

		la, err := a.Claim(ctx, "k1")
		require.NoError(t, err)
		fc.step(t, -time.Hour)
		// Heartbeats across the step.
		time.Sleep(ttl) // three heartbeat periods must pass on the real clock across the step
		require.NoError(t, la.Err(), "a step back must not end a held lease")
		require.Zero(t, events.Count(pglease.EventHeartbeatFailed), "no heartbeat may fail after a step back")
		// A claim and a re-entrant claim with the clock behind acquired_at.
		la2, err := a.Claim(ctx, "k1")
		require.NoError(t, err, "re-entrant claim after a step back")
		lb, err := b.Claim(ctx, "k2")
		require.NoError(t, err)
		require.NoError(t, la2.Unlock(ctx), "release after a step back")
		require.NoError(t, lb.Unlock(ctx))
		// The released key: can another holder claim it?
		_, errB := b.Claim(ctx, "k1")
		t.Logf("claim by b of k1 released by a, server clock 1h behind: %v", errB)
		fc.step(t, 0)
		la3, err := a.Claim(ctx, "k3")
		require.NoError(t, err)
		fc.step(t, -2*time.Hour)
		require.NoError(t, la3.Unlock(ctx), "release of a lease claimed before a 2h step back")
		fc.step(t, 0)
		require.Zero(t, events.Count(pglease.EventHeartbeatFailed))
	})

	// Guarantee: the ticks of a job (WithPeriod) are judged on the
	// server's clock, and a step of it by a quarter of the period, forward
	// then back, neither runs a tick twice nor drops one: three replicas
	// whose timers fire on the right clock each claim the tick nearest the
	// server's, which the step leaves where it was.
	t.Run("TicksNeitherDoubledNorDroppedByAQuarterPeriodStep", func(t *testing.T) {
		fc := startFakeClockServer(t)
		pool := pgtest.PoolAt(t, fc.srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		const period = 4 * time.Second // the fake clock steps by whole seconds: a quarter is 1s
		var (
			mu  sync.Mutex
			ran = map[int64]bool{} // fences of the runs
		)
		for _, name := range []string{"a", "b", "c"} {
			l := pgtest.Locker(t, pgtest.PoolAt(t, fc.srv.DSN(), nil), table, name)
			j, err := l.Job(pglease.WithPeriod(period))
			require.NoError(t, err)
			s, err := gocron.NewScheduler()
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Shutdown() }) // before the Locker's Close
			task, named := l.Task("job", func(_ context.Context, lease *pglease.Lease) error {
				mu.Lock()
				ran[lease.Fence()] = true
				mu.Unlock()
				return nil
			})
			_, err = j.Schedule(s, task, named)
			require.NoError(t, err)
			s.Start()
		}
		first := time.Now().Truncate(period).Add(period) // every scheduler has started
		time.Sleep(time.Until(first.Add(5 * period / 2)))
		fc.step(t, period/4)
		time.Sleep(2 * period)
		fc.step(t, 0)
		last := first.Add(6 * period)
		time.Sleep(time.Until(last.Add(period / 2)))

		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		runs, err := admin.Runs(pgtest.Ctx(t), "job", time.Hour) // a context of its own: the ticks took 30 s
		require.NoError(t, err)
		perTick := map[time.Time]int{}
		mu.Lock()
		defer mu.Unlock()
		for _, r := range runs {
			assert.True(t, ran[r.Fence], "the run of fence %d ran its task", r.Fence)
			perTick[r.Tick.UTC()]++
		}
		for k := first; !k.After(last); k = k.Add(period) {
			assert.Equal(t, 1, perTick[k.UTC()], "tick %v runs exactly once across the steps: %v", k, perTick)
		}
		t.Logf("figures: %d runs, ticks %v", len(runs), perTick)
	})

	// Assumption measured, not a guarantee: a forward step of the server's
	// clock by more than the TTL lets another holder claim while the holder
	// still trusts its lease. How long do both believe?
	t.Run("StepForwardCostsAtMostOneHeartbeat", func(t *testing.T) {
		fc := startFakeClockServer(t)
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolAt(t, fc.srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		const ttl = 3 * time.Second
		a := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl))
		la, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		fc.step(t, 10*time.Second)
		var lb *pglease.Lease
		for lb == nil {
			lb, err = b.Claim(ctx, "k")
			if err != nil {
				require.ErrorIs(t, err, pglease.ErrHeld)
				time.Sleep(5 * time.Millisecond)
			}
		}
		bAt := time.Now()
		overlap := time.Duration(0)
		if la.Err() == nil {
			<-la.Done()
			overlap = time.Since(bAt)
		}
		t.Logf("TTL %v, heartbeat %v: after a +10s server step, b claimed while a still trusted its lease for %v (fences a=%d b=%d)", ttl, ttl/3, overlap, la.Fence(), lb.Fence())
		// Expected (the documented clock assumption): the holder learns of the
		// loss at its next heartbeat, not later.
		// The bound is the documented one: until the holder's next heartbeat,
		// plus room for a late timer on a loaded machine.
		require.LessOrEqual(t, overlap, ttl/3+1500*time.Millisecond, "two holders believed at once for %v", overlap)
	})

	// A fence never goes backwards across a purge while the server's clock
	// steps forward by less than the purge horizon: the horizon is measured on
	// that clock, so a stalled claim that drew its fence before a row of a
	// later mandate still finds that row, and takes a new fence. (A forward
	// step beyond the horizon would purge the row a moment after it expired,
	// and the stalled claim would insert its smaller fence: that step already
	// breaks the clock assumption that mutual exclusion rests on.) The stall is
	// made deterministic by a BEFORE INSERT trigger (it fires after DEFAULT
	// nextval drew the fence) blocked on an advisory lock.
	t.Run("FenceSurvivesAPurgeAfterAStep", func(t *testing.T) {
		fc := startFakeClockServer(t)
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolAt(t, fc.srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		_, err := pool.Exec(ctx, fmt.Sprintf(`
CREATE FUNCTION stall_%[1]s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF split_part(NEW.holder, '#', 1) = 'stalled' THEN PERFORM pg_advisory_xact_lock(4242); END IF;
  RETURN NEW;
END $$;
CREATE TRIGGER stall BEFORE INSERT ON %[1]s FOR EACH ROW EXECUTE FUNCTION stall_%[1]s();`, table))
		require.NoError(t, err)

		gate, err := pgx.Connect(ctx, fc.srv.DSN())
		require.NoError(t, err)
		defer gate.Close(context.Background())
		_, err = gate.Exec(ctx, `SELECT pg_advisory_lock(4242)`)
		require.NoError(t, err)

		stalled := pgtest.Locker(t, pool, table, "stalled", pglease.WithTTL(time.Minute))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(time.Minute))

		got := pgtest.ClaimInBackground(ctx, stalled, "k")
		waitAdvisoryWaiter(t, pool)

		lb, err := b.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, lb.Unlock(ctx))

		// The server's clock is corrected forward by almost the horizon, and a
		// replica runs Migrate at start-up.
		fc.step(t, sqlstmt.DefaultRetention-time.Minute)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(table)))
		fc.step(t, 0)

		_, err = gate.Exec(ctx, `SELECT pg_advisory_unlock(4242)`)
		require.NoError(t, err)
		r := <-got
		require.NoError(t, r.Err)
		t.Logf("b was handed fence %d; the stalled claim, after the purge, fence %d", lb.Fence(), r.Lease.Fence())
		require.Greater(t, r.Lease.Fence(), lb.Fence(), "the fence of key k went backwards: %d after %d", r.Lease.Fence(), lb.Fence())
	})
}
