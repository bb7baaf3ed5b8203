package faults_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
)

// ackedLease is one acknowledged claim, as its holder saw it. Local times are
// monotonic readings of this one process; server times come from the
// database.
type ackedLease struct {
	key, holder   string
	fence         int64
	expiresAt     time.Time // server expiry as last known to the holder
	claimed       time.Time // local: Claim returned
	unlockStarted time.Time // local: Unlock called
	released      bool      // Unlock returned nil
}

// history collects the acknowledged leases of every holder.
type history struct {
	mu    sync.Mutex
	acked []*ackedLease
}

func (h *history) add(m *ackedLease) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.acked = append(h.acked, m)
}

// cycle claims key with l and releases it at once, recording both. It
// reports false when another holder's lease was live.
func (h *history) cycle(ctx context.Context, l *pglease.Locker, key string) (bool, error) {
	lease, err := l.Claim(ctx, key)
	if errors.Is(err, pglease.ErrHeld) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	m := &ackedLease{key: key, holder: l.Holder(), fence: lease.Fence(), claimed: time.Now()}
	h.add(m)
	return true, h.release(ctx, m, lease)
}

// release unlocks lease, recording it in m. The expiry is read after
// Unlock, which waits for any heartbeat round in flight: it is the last one
// the holder knew of.
func (h *history) release(ctx context.Context, m *ackedLease, lease *pglease.Lease) error {
	h.mu.Lock()
	m.unlockStarted = time.Now()
	h.mu.Unlock()
	err := lease.Unlock(ctx)
	h.mu.Lock()
	defer h.mu.Unlock()
	m.expiresAt = lease.ExpiresAt()
	m.released = err == nil
	return err
}

// byKey returns the mandates of each key in the order they were claimed.
func (h *history) byKey() map[string][]*ackedLease {
	h.mu.Lock()
	defer h.mu.Unlock()
	out := map[string][]*ackedLease{}
	for _, m := range h.acked {
		out[m.key] = append(out[m.key], m)
	}
	for _, ms := range out {
		slices.SortFunc(ms, func(a, b *ackedLease) int { return a.claimed.Compare(b.claimed) })
	}
	return out
}

// durableRow is a lease row after the restart, with how long it still has
// to live by the server's clock.
type durableRow struct {
	holder    string
	fence     int64
	expiresAt time.Time
	remaining time.Duration // negative once expired
}

func readDurableRow(t *testing.T, db pglease.DB, table, key string) durableRow {
	t.Helper()
	var (
		r    durableRow
		secs float64
	)
	require.NoError(t, db.QueryRow(context.Background(),
		fmt.Sprintf(`SELECT holder, fence, expires_at, extract(epoch FROM expires_at - clock_timestamp())::float8 FROM %s WHERE key = $1`,
			pgx.Identifier{table}.Sanitize()), key).
		Scan(&r.holder, &r.fence, &r.expiresAt, &secs), "row of %s after the crash", key)
	r.remaining = time.Duration(secs * float64(time.Second))
	return r
}

// takeOver claims key with each taker in turn, every 20 ms, until one gets
// it, failing the test after limit.
func takeOver(t *testing.T, takers []*pglease.Locker, key string, limit time.Duration) *pglease.Lease {
	t.Helper()
	deadline := time.Now().Add(limit)
	for i := 0; ; i++ {
		lease, err := takers[i%len(takers)].Claim(context.Background(), key)
		if err == nil {
			return lease
		}
		require.ErrorIs(t, err, pglease.ErrHeld, "claiming %s after the restart", key)
		require.True(t, time.Now().Before(deadline), "%s still held %v after the restart", key, limit)
		time.Sleep(20 * time.Millisecond)
	}
}

// TestDurability crashes the server right after claims, heartbeats and
// releases: what was acknowledged survives, and fences never go back.
func TestDurability(t *testing.T) {
	t.Parallel()
	// With synchronous_commit off at any level, a commit returns before its WAL
	// is flushed, and the WAL writer of crashServer flushes only every 10 s: a
	// crash right after the claims loses every one still in the server's memory,
	// and with them the sequence's advance. Each claim raises the setting for
	// its own transaction, so every claim acknowledged before the crash is
	// still live after it, and no fence is issued twice.
	t.Run("ClaimsSurviveACrash", func(t *testing.T) {
		// The subtests crash one shared server in turn.
		t.Parallel()
		srv := pgtest.CrashableServer(t)
		const keys = 200
		for _, scope := range syncOffScopes {
			t.Run(scope.name, func(t *testing.T) {
				ctx := pgtest.Ctx(t)
				table := pgtest.DurableTable(t, srv)
				exec(t, srv.DSN(), scope.set...)
				t.Cleanup(func() { exec(t, srv.DSN(), scope.reset...) })
				pool := syncOffPool(t, srv.DSN(), scope)

				before := pgtest.Locker(t, pool, table, "before", pglease.WithTTL(time.Minute))
				fences := make(map[string]int64, keys)
				var maxFence int64
				for k := range keys {
					key := fmt.Sprintf("job-%d", k)
					lease, err := before.Claim(ctx, key)
					require.NoError(t, err)
					fences[key] = lease.Fence()
					maxFence = max(maxFence, lease.Fence())
				}
				pgtest.CrashAndRestart(t, srv)
				pool.Close()
				// Its leases' releases fail on the dead pool; the rows stay.
				_ = before.Close(ctx)

				after := pgtest.PoolAt(t, srv.DSN(), nil)
				lost := 0
				for key, fence := range fences {
					row, ok := pgtest.ReadRow(t, after, table, key)
					if !ok || row.Fence != fence || !row.Live {
						lost++
					}
				}
				require.Zero(t, lost, "of %d claims acknowledged before the crash, %d are gone or changed after it", keys, lost)

				other := pgtest.Locker(t, after, table, "other", pglease.WithTTL(time.Minute))
				for key := range fences {
					_, err := other.Claim(ctx, key)
					require.ErrorIs(t, err, pglease.ErrHeld, "%s was claimed before the crash and is live until its TTL", key)
				}
				lease, err := other.Claim(ctx, "fresh")
				require.NoError(t, err)
				require.Greater(t, lease.Fence(), maxFence, "a fence after the crash is above every fence issued before it")
			})
		}
	})

	// A heartbeat acknowledged to the Locker moved its lease's expiry, and the
	// Locker trusts the lease until then: the crash must not bring the row back
	// to an earlier expiry, which another holder could claim while this one
	// still believes in its lease.
	t.Run("HeartbeatsSurviveACrash", func(t *testing.T) {
		t.Parallel()
		srv := pgtest.CrashableServer(t)
		ctx := pgtest.Ctx(t)
		scope := syncOffScopes[2] // database
		table := pgtest.DurableTable(t, srv)
		exec(t, srv.DSN(), scope.set...)
		pool := syncOffPool(t, srv.DSN(), scope)

		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "before", pglease.WithTTL(20*time.Second),
			pglease.WithHeartbeatInterval(time.Second), pglease.WithHook(events.Hook))
		const keys = 20
		leases := make([]*pglease.Lease, keys)
		for k := range leases {
			lease, err := l.Claim(ctx, fmt.Sprintf("job-%d", k))
			require.NoError(t, err)
			leases[k] = lease
		}
		// Right after a heartbeat round has extended every lease: the next one
		// is a second away.
		events.WaitFor(t, pglease.EventExtended, 5*time.Second)
		require.NoError(t, srv.Stop(pgserver.Immediate))
		require.NoError(t, srv.Start(ctx))
		after := pgtest.PoolAt(t, srv.DSN(), nil)
		for _, lease := range leases {
			believed := lease.ExpiresAt() // no heartbeat can succeed after the crash
			row, ok := pgtest.ReadRow(t, after, table, lease.Key())
			require.True(t, ok, "%s", lease.Key())
			require.Equal(t, lease.Fence(), row.Fence, "%s", lease.Key())
			require.False(t, row.ExpiresAt.Before(believed),
				"%s: the Locker believed in its lease until %v, the row after the crash expires at %v", lease.Key(), believed, row.ExpiresAt)
		}
		pool.Close()
		_ = l.Close(ctx)
	})

	t.Run("CrashAfterReleases", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		srv := pgtest.CrashableServer(t)
		pool := pgtest.PoolAt(t, srv.DSN(), nil)
		table := pgtest.Table(t, pool)

		const (
			ttl     = 5 * time.Second
			holders = 4
			keys    = 6
			cycles  = 40 // per holder
		)
		keyName := func(k int) string { return fmt.Sprintf("job-%d", k) }
		before := make([]*pglease.Locker, holders)
		for h := range before {
			before[h] = pgtest.Locker(t, pool, table, fmt.Sprintf("before-%d", h), pglease.WithTTL(ttl))
		}
		hist := &history{}

		// Many claim/release cycles, holders contending over the keys.
		var (
			wg        sync.WaitGroup
			failed    = make(chan error, holders)
			contended atomic.Int64
		)
		for h, l := range before {
			wg.Go(func() {
				for i := range cycles {
					won, err := hist.cycle(ctx, l, keyName((h+i*5)%keys))
					if err != nil {
						failed <- err
						return
					}
					if !won {
						contended.Add(1)
					}
				}
			})
		}
		wg.Wait()
		close(failed)
		for err := range failed {
			require.NoError(t, err)
		}
		t.Logf("%d of %d claims before the crash found the key held", contended.Load(), holders*cycles)

		// The burst: every key claimed (synchronous commits), then every key
		// released (asynchronous commits), and the server killed at once.
		leases := make([]*pglease.Lease, keys)
		burst := make([]*ackedLease, keys)
		for k := range leases {
			lease, err := before[k%holders].Claim(ctx, keyName(k))
			require.NoError(t, err)
			leases[k] = lease
			burst[k] = &ackedLease{key: keyName(k), holder: lease.Holder(), fence: lease.Fence(), claimed: time.Now()}
			hist.add(burst[k])
		}
		for k, lease := range leases {
			require.NoError(t, hist.release(ctx, burst[k], lease))
		}
		require.NoError(t, srv.Stop(pgserver.Immediate))
		for _, l := range before {
			require.NoError(t, l.Close(ctx), "nothing is held, so Close sends nothing")
		}

		// Before the crash: per key, fences grow in claim order, and a holder
		// got the key only after the previous holder had started its Unlock.
		var maxFence int64
		last := map[string]*ackedLease{}
		for key, ms := range hist.byKey() {
			for i, m := range ms {
				maxFence = max(maxFence, m.fence)
				if i == 0 {
					continue
				}
				prev := ms[i-1]
				require.Greater(t, m.fence, prev.fence, "fences of %s grow in claim order", key)
				if m.holder != prev.holder {
					require.False(t, prev.unlockStarted.IsZero(), "%s fence %d was never released", key, prev.fence)
					require.True(t, m.claimed.After(prev.unlockStarted),
						"%s: %s got fence %d before %s released fence %d", key, m.holder, m.fence, prev.holder, prev.fence)
				}
			}
			last[key] = ms[len(ms)-1]
		}
		require.Len(t, last, keys)

		require.NoError(t, srv.Start(ctx))
		after := pgtest.PoolAt(t, srv.DSN(), nil)

		// Every acknowledged claim survived; some acknowledged releases did not.
		rows := map[string]durableRow{}
		lost := 0
		for key, m := range last {
			row := readDurableRow(t, after, table, key)
			rows[key] = row
			require.Equal(t, m.fence, row.fence, "%s: the last acknowledged claim is the row after the crash", key)
			require.Equal(t, m.holder, row.holder, "%s", key)
			require.True(t, m.released, "%s: every mandate was released before the crash", key)
			if row.expiresAt.Equal(m.expiresAt) {
				lost++ // the release was acknowledged, and lost: the row is as claimed
			} else {
				require.True(t, row.expiresAt.Before(m.expiresAt), "%s: a release only brings the expiry forward", key)
			}
		}
		t.Logf("%d of %d acknowledged releases of the burst were lost in the crash", lost, keys)
		require.Positive(t, lost, "the crash lost no acknowledged release: the case under test did not happen")

		// After the restart, other holders take every key: while a lease whose
		// release was lost is live they get ErrHeld, they get the key only once
		// it has expired, and always with a fence above every fence issued
		// before the crash.
		takers := make([]*pglease.Locker, holders)
		acquired := map[int64]time.Duration{} // fence -> round trip of its claim
		var acquiredMu sync.Mutex
		for h := range takers {
			takers[h] = pgtest.Locker(t, after, table, fmt.Sprintf("after-%d", h), pglease.WithTTL(ttl),
				pglease.WithHook(func(ev pglease.Event) {
					if ev.Kind == pglease.EventAcquired {
						acquiredMu.Lock()
						acquired[ev.Fence] = ev.Took
						acquiredMu.Unlock()
					}
				}))
		}
		blocked := 0
		for key := range rows {
			if readDurableRow(t, after, table, key).remaining > 500*time.Millisecond {
				_, err := takers[0].Claim(ctx, key)
				require.ErrorIs(t, err, pglease.ErrHeld, "%s: the lease whose release was lost still blocks others", key)
				blocked++
			}
		}
		for key, row := range rows {
			lease := takeOver(t, takers, key, ttl+10*time.Second)
			require.Greater(t, lease.Fence(), maxFence, "%s: no fence after the crash is below one acknowledged before it", key)
			acquiredMu.Lock()
			took := acquired[lease.Fence()]
			acquiredMu.Unlock()
			// The claim decides within its own round trip after acquired_at.
			assert.False(t, row.expiresAt.After(lease.AcquiredAt().Add(took)),
				"%s: fence %d acquired at %v, before the previous lease expired at %v", key, lease.Fence(), lease.AcquiredAt(), row.expiresAt)
			require.NoError(t, lease.Unlock(ctx))
		}
		t.Logf("%d keys were still blocked by a lost release when checked after the restart", blocked)
	})
}

// syncOffScope turns synchronous_commit off for the connections a pool opens
// from now on, at one level of PostgreSQL's settings, and says how to undo it.
type syncOffScope struct {
	name    string
	set     []string // run as the server's superuser
	reset   []string
	runtime bool // set it as a connection parameter instead
}

var syncOffScopes = []syncOffScope{
	{name: "session", runtime: true},
	{name: "role",
		set:   []string{`DO $$ BEGIN EXECUTE format('ALTER ROLE %I SET synchronous_commit = off', current_user); END $$`},
		reset: []string{`DO $$ BEGIN EXECUTE format('ALTER ROLE %I RESET synchronous_commit', current_user); END $$`}},
	{name: "database",
		set:   []string{`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I SET synchronous_commit = off', current_database()); END $$`},
		reset: []string{`DO $$ BEGIN EXECUTE format('ALTER DATABASE %I RESET synchronous_commit', current_database()); END $$`}},
	{name: "server",
		set:   []string{`ALTER SYSTEM SET synchronous_commit = off`, `SELECT pg_reload_conf()`},
		reset: []string{`ALTER SYSTEM RESET synchronous_commit`, `SELECT pg_reload_conf()`}},
}

// exec runs statements on a connection of its own.
func exec(t *testing.T, dsn string, stmts ...string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	conn, err := pgx.Connect(ctx, dsn)
	require.NoError(t, err)
	defer conn.Close(ctx)
	for _, s := range stmts {
		_, err := conn.Exec(ctx, s)
		require.NoError(t, err, "%s", s)
	}
}

// syncOffPool opens a pool whose sessions run with synchronous_commit off
// because of scope, and checks that they do.
func syncOffPool(t *testing.T, dsn string, scope syncOffScope) *pgxpool.Pool {
	t.Helper()
	pool := pgtest.PoolWith(t, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = 4
		if scope.runtime {
			cfg.ConnConfig.RuntimeParams["synchronous_commit"] = "off"
		}
	})
	// A reload reaches every backend soon, not at once: wait until a new
	// session sees it.
	require.Eventually(t, func() bool {
		conn, err := pgx.ConnectConfig(context.Background(), pool.Config().ConnConfig)
		require.NoError(t, err)
		defer conn.Close(context.Background())
		var got string
		require.NoError(t, conn.QueryRow(context.Background(), `SHOW synchronous_commit`).Scan(&got))
		return got == "off"
	}, 10*time.Second, 20*time.Millisecond, "sessions never saw synchronous_commit = off set at the %s level", scope.name)
	return pool
}
