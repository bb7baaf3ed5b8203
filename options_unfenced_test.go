package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// legacyTable creates, as another owner, the lease table an older library
// left behind (no fence column), and a runtime role that may only SELECT,
// INSERT and UPDATE it. It returns the table and the runtime role's DSN.
func legacyTable(t *testing.T, columns string) (string, string) {
	t.Helper()
	ctx := pgtest.Ctx(t)
	admin := pgtest.Pool(t, nil)
	table := pgtest.Name("legacy_lease")
	owner, runtime := pgtest.Name("legacy_owner"), pgtest.Name("legacy_rt")
	for _, stmt := range []string{
		fmt.Sprintf(`CREATE ROLE %s NOLOGIN`, owner),
		fmt.Sprintf(`CREATE ROLE %s LOGIN PASSWORD 'legacy-secret'`, runtime),
		fmt.Sprintf(`CREATE TABLE %s (%s)`, table, columns),
		fmt.Sprintf(`ALTER TABLE %s OWNER TO %s`, table, owner),
		fmt.Sprintf(`GRANT SELECT, INSERT, UPDATE ON %s TO %s`, table, runtime),
	} {
		_, err := admin.Exec(ctx, stmt)
		require.NoError(t, err, stmt)
	}
	t.Cleanup(func() {
		_, _ = admin.Exec(context.Background(), fmt.Sprintf(`DROP TABLE %s; DROP ROLE %s; DROP OWNED BY %s; DROP ROLE %s`, table, owner, runtime, runtime))
	})
	cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	return table, strings.Replace(pgtest.Server.DSN(), cfg.User+"@", runtime+":legacy-secret@", 1)
}

const legacyColumns = `key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL, acquired_at timestamptz`

// leaseTable is, for a test run on both kinds of table, a pool and a lease
// table with the options a Locker needs on it: a fresh table of Migrate on
// the shared server if fenced, else a legacy one (legacyTable) reached as
// its runtime role, with WithoutFenceColumn.
func leaseTable(t *testing.T, fenced bool) (*pgxpool.Pool, string, []pglease.Option) {
	t.Helper()
	if fenced {
		pool := pgtest.Pool(t, nil)
		return pool, pgtest.Table(t, pool), nil
	}
	table, dsn := legacyTable(t, legacyColumns)
	return pgtest.PoolAt(t, dsn, nil), table, []pglease.Option{pglease.WithoutFenceColumn()}
}

// TestWithoutFenceColumn pins WithoutFenceColumn, for tables of a plain
// (key, holder, expires_at) lock: the same guarantees of one holder at a
// time, with the holder standing in for the fence.
func TestWithoutFenceColumn(t *testing.T) {
	t.Parallel()
	// Guarantee: without the fence column, two Lockers given one WithHolder
	// never both hold a key.
	t.Run("SameHolderInTwoLockersNeverBothHold", func(t *testing.T) { testSameHolderNeverBothHold(t, false) })
	// Guarantee: without the fence column, during a rolling deploy, a replica
	// of the previous version and one of this version given one WithHolder
	// never both hold a key.
	t.Run("SameHolderInTwoVersionsNeverBothHold", func(t *testing.T) { testSameHolderInTwoVersions(t, false) })
	// Guarantee: two Lockers never both hold a key; re-entrancy belongs to
	// one Locker. During a move from WithoutFenceColumn to a migrated table,
	// a fenced replica shares the table with unfenced ones; the unfenced
	// Locker takes over any live row whose holder has the shape of its own
	// forge (its holder, '#', 16 hex digits). A fenced Locker's holder could
	// have it only through a WithHolder with '#' (that Locker's Holder(),
	// copied from `pglease status`), which NewLocker refuses in every mode;
	// and a fenced Locker of the unfenced one's name holds its lease.
	t.Run("NeverTakesAFencedLockersLiveLease", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		table := pgtest.Table(t, pool)
		unfenced := pgtest.Locker(t, pool, table, "svc", pglease.WithoutFenceColumn(), pglease.WithTTL(time.Minute))
		msg := panicMessage(func() {
			pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(unfenced.Holder()))
		})
		require.Contains(t, msg, "WithHolder", "a fenced Locker whose holder has the forged shape is refused, naming the option")
		require.Contains(t, msg, `must not contain "#"`, "and the character")

		fenced := pgtest.Locker(t, pool, table, "svc", pglease.WithTTL(time.Minute))
		held, err := fenced.Claim(ctx, "job")
		require.NoError(t, err)
		taken, err := unfenced.Claim(ctx, "job")
		if err == nil {
			_, stillHeld := fenced.Held("job")
			assert.Fail(t, "two Lockers hold one key",
				"fenced Locker %s holds job (fence %d, Err %v, held %v) and unfenced Locker %s took it as %s",
				fenced.Holder(), held.Fence(), held.Err(), stillHeld, unfenced.Holder(), taken.Holder())
			return
		}
		require.ErrorIs(t, err, pglease.ErrHeld)
	})

	// Guarantee: without the fence column, a late release of a previous mandate
	// leaves the reclaimed lease untouched.
	t.Run("LateReleaseSparesTheReclaimedLease", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn(), pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))

		first, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		second, err := l.Claim(ctx, "job")
		require.NoError(t, err, "a replica re-claims its own live lease")
		assert.Zero(t, second.Fence(), "no fence column, no fence")
		assert.True(t, strings.HasPrefix(second.Holder(), "replica-1#"))
		assert.NotEqual(t, first.Holder(), second.Holder(), "one holder identifier per mandate")

		require.ErrorIs(t, first.Unlock(ctx), pglease.ErrLost, "the first mandate's release is late")
		row, ok := readLegacyRow(t, pool, table, "job")
		require.True(t, ok)
		assert.Equal(t, second.Holder(), row.Holder)
		assert.True(t, row.Live)

		// The heartbeat keeps the second mandate alive across TTLs.
		start := second.ExpiresAt()
		require.Eventually(t, func() bool { return second.ExpiresAt().Sub(start) > 2*time.Second }, 5*time.Second, 20*time.Millisecond)
		require.NoError(t, second.Err())
		other := pgtest.Locker(t, pool, table, "replica-2", pglease.WithoutFenceColumn())
		_, err = other.Claim(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.NoError(t, second.Unlock(ctx))
		_, err = other.Claim(ctx, "job")
		require.NoError(t, err, "released")
	})

	// Guarantee: without the fence column too, claims of rows locked by
	// another transaction leave a connection to the claims of free keys (as
	// TestBurst/FreeKeyNotHeldUpByLockedRows with it): on a pool of 4, four
	// claims of locked rows wait, and the claim of a free key takes its lease
	// long before the locks end.
	t.Run("FreeKeyNotHeldUpByLockedRows", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		admin := pgtest.Pool(t, nil)
		app := pgtest.AppName("freekeyunfenced")
		pool := pgtest.PoolWith(t, dsn, func(c *pgxpool.Config) {
			c.MaxConns = 4
			c.ConnConfig.RuntimeParams["application_name"] = app
		})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn())
		tx := lockedRows(ctx, t, admin, table, 4)
		blocked := claimLockedRows(ctx, l, 4)
		require.Eventually(t, func() bool {
			var n int
			_ = admin.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock'`, app).Scan(&n)
			return n >= 3
		}, 10*time.Second, 2*time.Millisecond, "claims wait on the locked rows")

		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		start := time.Now()
		lease, err := l.Claim(fctx, "free")
		took := time.Since(start)
		committed := tx.Commit(ctx)
		require.NoError(t, err, "the claim of a free key, while claims of locked rows wait (took %v)", took.Round(time.Millisecond))
		require.NoError(t, lease.Unlock(ctx))
		require.NoError(t, committed)
		for range 4 {
			require.NoError(t, <-blocked, "each waiting claim takes its row once the lock is gone")
		}
	})

	// Guarantee: without the fence column, a stolen row is detected as lost.
	t.Run("StolenRowIsLost", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, `key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL`)
		pool := pgtest.PoolAt(t, dsn, nil)
		const ttl = time.Second
		l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn(), pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200*time.Millisecond),
			pglease.WithMinHold(500*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = 'replica-9#feed' WHERE key = 'job'`, table))
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, ttl)
		require.ErrorIs(t, lease.Err(), pglease.ErrLost)
		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrLost)
		row, _ := readLegacyRow(t, pool, table, "job")
		assert.Equal(t, "replica-9#feed", row.Holder, "the new mandate's row is untouched")
		assert.True(t, row.Live)

		// Min hold works without an acquired_at column: counted from the claim.
		_, err = pool.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = clock_timestamp() WHERE key = 'job'`, table))
		require.NoError(t, err)
		again, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		require.NoError(t, again.Unlock(ctx))
		row, _ = readLegacyRow(t, pool, table, "job")
		assert.Equal(t, again.AcquiredAt().Add(500*time.Millisecond).UnixMicro(), row.ExpiresAt.UnixMicro())
	})

	// Guarantee: without the fence column, every tick runs exactly once across
	// three skewed schedulers.
	t.Run("EveryTickOnceAcrossSkewedSchedulers", func(t *testing.T) {
		t.Parallel()
		table, dsn := legacyTable(t, legacyColumns)
		const ticks = 10
		perTick := runSkewedSchedulersOn(t, dsn, table, ticks, pglease.WithoutFenceColumn(), pglease.WithMinHold(300*time.Millisecond))
		for k := 0; k < ticks; k++ {
			assert.Equal(t, 1, perTick[k], "tick %d runs exactly once", k)
		}
	})

	// Guarantee: a rolling deploy alongside old replicas that hold plainly never
	// runs a tick twice.
	t.Run("RollingDeployNeverRunsATickTwice", func(t *testing.T) {
		t.Parallel()
		table, dsn := legacyTable(t, legacyColumns)
		// The run outlasts the latest timer by 100 ms, and ends 350 ms
		// before the next tick's first.
		const period, ticks = 600 * time.Millisecond, 8
		log := newRunLog()
		skews := []time.Duration{0, 50 * time.Millisecond, 100 * time.Millisecond, 150 * time.Millisecond}
		names := make([]string, len(skews))
		lockers := make([]gocron.Locker, len(skews))
		ctx := pgtest.Ctx(t)
		for i := range skews {
			names[i] = fmt.Sprintf("new-%d", i)
			if i%2 == 0 {
				names[i] = fmt.Sprintf("old-%d", i)
				lockers[i] = &oldLocker{pool: pgtest.PoolAt(t, dsn, nil), table: table, holder: names[i]}
			} else {
				lockers[i] = pgtest.Locker(t, pgtest.PoolAt(t, dsn, nil), table, names[i], pglease.WithoutFenceColumn(), pglease.WithTTL(5*time.Second))
			}
			// What a replica does once, before its first tick (a
			// connection, the check of the table), is done before the
			// ticks begin: the replicas' skews are then the test's alone,
			// not a loaded machine's.
			warm, err := lockers[i].Lock(ctx, "warm-up "+names[i])
			require.NoError(t, err)
			require.NoError(t, warm.Unlock(ctx))
		}
		base := time.Now().Add(500 * time.Millisecond)
		var wg sync.WaitGroup
		defer wg.Wait()
		// Each scheduler is shut down once, its later callers waiting for
		// that: gocron's Shutdown of a scheduler that has just stopped can
		// wait out its stop timeout (12 s) before it sees it stopped.
		shutdown := map[string]func() error{}
		for i, skew := range skews {
			name, locker := names[i], lockers[i]
			s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
			require.NoError(t, err)
			shutdown[name] = sync.OnceValue(s.Shutdown)
			t.Cleanup(func() { _ = shutdown[name]() })
			_, err = s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {
				x := run{replica: name, start: time.Now()}
				log.started <- x
				time.Sleep(250 * time.Millisecond) // longer than the skew: replicas contend while it runs
				x.end = time.Now()
				log.add(x)
			}), gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(base.Add(skew))))
			require.NoError(t, err)
			s.Start()
		}
		tickOf := func(at time.Time) int { return int(at.Sub(base.Add(-100*time.Millisecond)) / period) }
		limit := time.After((ticks+1)*period + 5*time.Second)
		for done := false; !done; {
			select {
			case x := <-log.started:
				done = tickOf(x.start) > ticks
				if tickOf(x.start) == ticks/2 && x.replica == "old-0" {
					// The deploy goes on: the old replica that fires first is
					// replaced, so new ones take the ticks from now on.
					wg.Go(func() { _ = shutdown["old-0"]() })
				}
			case <-limit:
				t.Fatal("the schedulers stopped ticking")
			}
		}
		// Shutdown returns once the runs in progress have ended: every run
		// that started is then in the log, and no other starts.
		for _, stop := range shutdown {
			wg.Go(func() { _ = stop() })
		}
		wg.Wait()
		runs := log.all()
		perTick := map[int]int{}
		kinds := map[string]int{}
		for i, x := range runs {
			perTick[tickOf(x.start)]++
			kinds[x.replica[:3]]++
			if i > 0 {
				require.False(t, x.start.Before(runs[i-1].end), "%s and %s ran at once", runs[i-1].replica, x.replica)
			}
		}
		for k := 0; k < ticks; k++ {
			assert.Equal(t, 1, perTick[k], "tick %d runs exactly once", k)
		}
		assert.Positive(t, kinds["old"], "old replicas ran ticks")
		assert.Positive(t, kinds["new"], "new replicas ran ticks")
		t.Logf("runs by old replicas: %d, by new ones: %d", kinds["old"], kinds["new"])
	})

	// Guarantee: without the fence column, a table that lacks what it needs is
	// reported and nothing is written.
	t.Run("ReportsWhatTheTableLacks", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		cases := map[string]struct{ columns, want string }{
			"no holder":       {`key text PRIMARY KEY, expires_at timestamptz NOT NULL`, "no column holder"},
			"short holder":    {`key text PRIMARY KEY, holder varchar(12) NOT NULL, expires_at timestamptz NOT NULL`, "too short"},
			"naive timestamp": {`key text PRIMARY KEY, holder text NOT NULL, expires_at timestamp NOT NULL`, "expires_at timestamp without time zone"},
			"no unique key":   {`key text, holder text NOT NULL, expires_at timestamptz NOT NULL`, "no unique index"},
			"extra not null":  {`key text PRIMARY KEY, holder text NOT NULL, expires_at timestamptz NOT NULL, owner_team text NOT NULL`, "owner_team is NOT NULL without a default"},
		}
		for name, tc := range cases {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				table, dsn := legacyTable(t, tc.columns)
				pool := pgtest.PoolAt(t, dsn, nil)
				l := pgtest.Locker(t, pool, table, "replica-1", pglease.WithoutFenceColumn())
				ctx := pgtest.Ctx(t)
				_, err := l.Claim(ctx, "job")
				require.ErrorContains(t, err, tc.want)
				if name != "naive timestamp" { // refused in both modes, by the table's check (TestTable/RefusesAnExpiryOtherThanTimestamptz)
					require.ErrorContains(t, err, "cannot be used WithoutFenceColumn")
				}
				var rows int
				require.NoError(t, pool.QueryRow(ctx, "SELECT count(*) FROM "+table).Scan(&rows))
				require.Zero(t, rows)
			})
		}
		pool := pgtest.Pool(t, nil)
		l := pgtest.Locker(t, pool, "no_such_legacy_table", "replica-1", pglease.WithoutFenceColumn())
		_, err := l.Claim(ctx, "job")
		require.ErrorContains(t, err, "table no_such_legacy_table does not exist")

		require.Contains(t, panicMessage(func() {
			pglease.NewLocker(pool, pglease.WithoutFenceColumn(), pglease.WithHolder("a#b"))
		}), "must not contain \"#\"")
	})

	// Guarantee: the check refuses only a table that cannot work. A varchar
	// holder column is measured in characters; the check counts the bytes
	// of the forged holder, so a column exactly as long as the WithHolder
	// value plus 34 characters (the documented 17 twice) is refused for a
	// non-ASCII WithHolder, though every holder fits.
	t.Run("AcceptsAHolderColumnThatFits", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		const name = "réplica-1" // 9 characters, 10 bytes
		width := utf8.RuneCountInString(name) + 2*(1+16)
		table, dsn := legacyTable(t, fmt.Sprintf(`key text PRIMARY KEY, holder varchar(%d) NOT NULL, expires_at timestamptz NOT NULL`, width))
		pool := pgtest.PoolAt(t, dsn, nil)
		l := pgtest.Locker(t, pool, table, name, pglease.WithoutFenceColumn())
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err, "a varchar(%d) holder column takes every %d-character holder of %q", width, width, name)
		require.Equal(t, width, utf8.RuneCountInString(lease.Holder()))
		require.NoError(t, lease.Unlock(ctx))
	})

	// Guarantee: without the fence column, a live lease whose holder only looks
	// like its own is never taken.
	t.Run("NeverTakesALookalikeHoldersLease", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		insert := func(key, holder string) {
			t.Helper()
			_, err := pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, expires_at) VALUES ($1, $2, clock_timestamp() + interval '1 hour')`, table), key, holder)
			require.NoError(t, err)
		}
		// Live holders that start with the Locker's name and '#' but that it
		// did not forge: plain holders of an older library, lookalikes, and
		// the forged holders of other Lockers of that name.
		foreign := map[string]string{
			"plain":        "host-1#worker",
			"not hex":      "host-1#0123456789abcdeg",
			"too short":    "host-1#0123456789abcde",
			"too long":     "host-1#0123456789abcdef0",
			"uppercase":    "host-1#0123456789ABCDEF",
			"two suffixes": "host-1#0123456789abcdef#0123456789abcdef",
			"newline":      "host-1#0123456789abcde\n",
			"metachars":    "hXst_1%#0123456789abcdef", // what "h.st_1%" would match as a LIKE or regex pattern
			// Forged by another Locker named host-1: of the previous version,
			// or of this version (a previous process, another replica).
			"previous version": "host-1#0123456789abcdef",
			"another Locker":   "host-1#fedcba9876543210#0123456789abcdef",
		}
		for key, holder := range foreign {
			insert(key, holder)
		}
		l := pgtest.Locker(t, pool, table, "host-1", pglease.WithoutFenceColumn())
		meta := pgtest.Locker(t, pool, table, "h.st_1%", pglease.WithoutFenceColumn())
		for key, holder := range foreign {
			before, ok := readLegacyRow(t, pool, table, key)
			require.True(t, ok)
			for _, claimer := range []*pglease.Locker{l, meta} {
				_, err := claimer.Claim(ctx, key)
				require.ErrorIs(t, err, pglease.ErrHeld, "%s: %q is another replica's live lease", key, holder)
			}
			after, _ := readLegacyRow(t, pool, table, key)
			assert.Equal(t, before, after, "%s: the row is untouched", key)
		}

		// What this Locker forged is still its own: re-entrant.
		for _, claimer := range []*pglease.Locker{l, meta} {
			first, err := claimer.Claim(ctx, "own")
			if claimer == meta {
				require.ErrorIs(t, err, pglease.ErrHeld, "another replica's forged lease")
				first, err = claimer.Claim(ctx, "own-meta")
			}
			require.NoError(t, err)
			second, err := claimer.Claim(ctx, first.Key())
			require.NoError(t, err, "a replica re-claims its own live lease")
			require.ErrorIs(t, first.Err(), pglease.ErrLost)
			row, _ := readLegacyRow(t, pool, table, first.Key())
			assert.Equal(t, second.Holder(), row.Holder)
		}
	})

	// Guarantee: without the fence column, concurrent re-entrant claims keep the
	// row's own mandate.
	t.Run("ConcurrentReentrantClaimsKeepTheLease", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		other := pgtest.Locker(t, pool, table, "replica-2", pglease.WithoutFenceColumn())
		opts := []pglease.Option{pglease.WithoutFenceColumn(), pglease.WithHeartbeatInterval(100 * time.Millisecond)}

		// requireRowsLease checks that the lease l holds is the row's, and
		// that its Unlock frees the key for another holder at once.
		requireRowsLease := func(l *pglease.Locker, key string) {
			t.Helper()
			held, ok := l.Held(key)
			require.True(t, ok, "one of the claims is held")
			row, _ := readLegacyRow(t, pool, table, key)
			require.Equal(t, row.Holder, held.Holder(), "the lease held is the row's mandate")
			require.NoError(t, held.Unlock(ctx))
			taken, err := other.Claim(ctx, key)
			require.NoError(t, err, "released: claimable at once")
			require.NoError(t, taken.Unlock(ctx))
		}

		// Forced: the first claim commits, then returns only after a second
		// claim of the same key has had every chance to commit and register.
		gate := &scanGateDB{DB: pool, scanned: make(chan struct{}), release: make(chan struct{})}
		l := pgtest.Locker(t, gate, table, "replica-1", opts...)
		first := make(chan error, 1)
		go func() { _, err := l.Claim(ctx, "forced"); first <- err }()
		<-gate.scanned
		second := make(chan error, 1)
		go func() { _, err := l.Claim(ctx, "forced"); second <- err }()
		var secondErr error
		select {
		case secondErr = <-second: // it ran while the first was in flight
			close(gate.release)
		case <-time.After(time.Second): // it waits for the first to return
			close(gate.release)
			secondErr = <-second
		}
		require.NoError(t, <-first)
		require.NoError(t, secondErr)
		requireRowsLease(l, "forced")

		// Free: many claims of one key at once, round after round.
		l = pgtest.Locker(t, pool, table, "replica-3", opts...)
		for round := range 20 {
			key := fmt.Sprintf("free-%d", round)
			var wg sync.WaitGroup
			for range 8 {
				wg.Go(func() {
					_, err := l.Claim(ctx, key)
					assert.NoError(t, err)
				})
			}
			wg.Wait()
			requireRowsLease(l, key)
		}
	})

	// Jobs of ticks (WithPeriod, WithCron): the tick travels in the forged
	// holder.
	t.Run("EachTickAtMostOnceAcrossOffsetClocks", testWithoutFenceColumnEachTickAtMostOnceAcrossOffsetClocks)
	t.Run("ATickRunIsNeverClaimedAgain", testWithoutFenceColumnATickRunIsNeverClaimedAgain)
	t.Run("AnEarlierTicksRunKeepsItsLease", testWithoutFenceColumnAnEarlierTicksRunKeepsItsLease)
	t.Run("AtMostOnceUnderConcurrentClaimsAtItsEdge", testWithoutFenceColumnAtMostOnceUnderConcurrentClaimsAtItsEdge)
	t.Run("ATickWrittenWhileTheClaimWaitsOnTheRowIsNotTakenAgain", testWithoutFenceColumnATickWrittenWhileTheClaimWaitsOnTheRowIsNotTakenAgain)
	t.Run("TheHolderCarriesTheTickExactly", testWithoutFenceColumnTheHolderCarriesTheTickExactly)
	t.Run("PlainClaimsGuardAndElectorWorkOnRowsThatCarryATick", testWithoutFenceColumnPlainClaimsGuardAndElectorWorkOnRowsThatCarryATick)
	t.Run("HolderColumnTooShortForTicksIsRefused", testWithoutFenceColumnHolderColumnTooShortForTicksIsRefused)
	t.Run("CatchUpIsRefused", testWithoutFenceColumnCatchUpIsRefused)
	t.Run("RunsSaysTheTableHasNoLedger", testWithoutFenceColumnRunsSaysTheTableHasNoLedger)
	t.Run("ThePurgeKeepsEveryRowThatCarriesATick", testWithoutFenceColumnThePurgeKeepsEveryRowThatCarriesATick)
}

// Guarantee (docs/GUIDE.md, Ticks): "The purge keeps every row that carries
// a tick, however old: it is the only record that the tick ran, and a claim
// may come for that tick up to half a period after it"; WithoutFenceColumn
// "the tick travels in the holder" and "a run released ... is never run
// again". Case: a job of a long period (hours; a daily job's is 24h) on a
// frozen table. Its tick was claimed and run, and released at once, two
// hours ago by the server's clock, and is still the nearest tick (the
// period is more than four hours), as for a replica whose clock is two
// hours behind (off by less than half the period). The row that carries
// the tick in its holder is then what such a run leaves; the test moves
// its expiry two hours back instead of waiting for them. An operator's
// Admin.Purge with the smallest horizon (MinRetention, 1h) must keep it,
// and the tick must not be claimed again.
func testWithoutFenceColumnThePurgeKeepsEveryRowThatCarriesATick(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	owner := pgtest.Pool(t, nil) // the operator's role, which may DELETE
	const back = 2 * time.Hour
	period := fitPeriod(t, 6*time.Hour, back+5*time.Minute, 5*time.Minute)
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn()), pglease.WithPeriod(period))
	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))
	row, ok := readLegacyRow(t, pool, table, "k")
	require.True(t, ok)
	require.False(t, row.Live, "released")
	require.True(t, strings.HasSuffix(row.Holder, "@"+first.Tick().UTC().Format(tickLayout)), "the holder %q carries the tick %v", row.Holder, first.Tick())

	// The run was two hours ago: the same row, its times two hours back.
	_, err = owner.Exec(ctx, fmt.Sprintf(`UPDATE %s SET expires_at = expires_at - make_interval(secs => $2),
	       acquired_at = acquired_at - make_interval(secs => $2) WHERE key = $1`, table), "k", back.Seconds())
	require.NoError(t, err)

	admin, err := pglease.NewAdmin(owner, pglease.WithTable(table), pglease.WithoutFenceColumn())
	require.NoError(t, err)
	n, err := admin.Purge(ctx, time.Hour)
	require.NoError(t, err)
	_, kept := readLegacyRow(t, pool, table, "k")
	assert.True(t, kept, "the purge deleted the row that carries tick %v, run %v ago (%d rows purged)", first.Tick(), back, n)

	for name, l := range map[string]*pglease.Locker{
		"the replica that ran it": nil,
		"another replica":         pgtest.Locker(t, pool, table, "b", pglease.WithoutFenceColumn()),
	} {
		j := a
		if l != nil {
			j = mustJob(t, l, pglease.WithPeriod(period))
		}
		again, err := j.Claim(ctx, "k")
		if err == nil {
			assert.Failf(t, "tick run twice", "%s claimed tick %v again (%s), run and released %v ago", name, again.Tick(), again.Holder(), back)
			require.NoError(t, again.Unlock(ctx))
			continue
		}
		assert.ErrorIs(t, err, pglease.ErrHeld, name)
	}
}

// tickLayout is the form of a tick in a forged holder, after '@'.
const tickLayout = "2006-01-02T15:04:05.000000Z"

// Guarantee: three replicas of a table without a fence column, whose
// clocks are up to 0.4 of the period apart, no min hold: every tick of a
// job runs at most once; a job that returns at once runs every tick exactly
// once; a job that takes 1.5 periods keeps its lease through its run.
func testWithoutFenceColumnEachTickAtMostOnceAcrossOffsetClocks(t *testing.T) {
	t.Parallel()
	table, dsn := legacyTable(t, legacyColumns)
	eachTickAtMostOnceAcrossOffsetClocks(t, 20, func() pglease.DB { return pgtest.PoolAt(t, dsn, nil) }, table, pglease.WithoutFenceColumn())
}

// Guarantee: without a fence column, a tick once claimed is never claimed
// again, by a replica restarted within the period (a new Locker) nor by the
// one that ran it, though its run ended and released the key (expired in
// place, its holder and so its tick kept); the next tick is claimed.
func testWithoutFenceColumnATickRunIsNeverClaimedAgain(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	const period = 3 * time.Second
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn()), pglease.WithPeriod(period))
	sleepToPhase(period, 0.1) // far from a tick's edge: the claims below see the same tick
	first, err := a.Claim(ctx, "k")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))
	row, ok := readLegacyRow(t, pool, table, "k")
	require.True(t, ok)
	require.False(t, row.Live, "released")
	require.Equal(t, first.Holder(), row.Holder, "released in place, its holder kept")

	restarted := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn()), pglease.WithPeriod(period))
	_, err = restarted.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "a restarted replica claimed the tick run")
	require.ErrorContains(t, err, "already taken")
	_, err = a.Claim(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "the replica that ran the tick claimed it again")
	_, err = a.Lock(ctx, "k")
	require.ErrorIs(t, err, pglease.ErrHeld, "the replica that ran the tick locked it again")
	after, _ := readLegacyRow(t, pool, table, "k")
	assert.Equal(t, row, after, "the row is untouched")

	time.Sleep(time.Until(first.Tick().Add(period)))
	next, err := restarted.Claim(ctx, "k")
	require.NoError(t, err)
	assert.True(t, next.Tick().Equal(first.Tick().Add(period)), "the next tick: %v after %v", next.Tick(), first.Tick())
	require.NoError(t, next.Unlock(ctx))
}

// Guarantee: without a fence column, a run that outlasts its period keeps
// its lease: the claim of the next tick is ErrHeld, by its own Locker, by a
// Locker of the same replica restarted, and by another replica, whose
// error names the tick of the run that holds the key.
func testWithoutFenceColumnAnEarlierTicksRunKeepsItsLease(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	const period = time.Second
	la := pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn())
	a := mustJob(t, la, pglease.WithPeriod(period))
	sleepToPhase(period, 0.2) // far from a tick's edge
	lock, err := a.Lock(ctx, "k")
	require.NoError(t, err)
	run := lock.(*pglease.Lease)
	// The run of that tick outlasts its period: the next tick comes.
	time.Sleep(time.Until(run.Tick().Add(period + 150*time.Millisecond)))
	for name, j := range map[string]*pglease.JobLocker{
		"its own Locker":        a,
		"the same replica anew": mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn()), pglease.WithPeriod(period)),
		"another replica":       mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithoutFenceColumn()), pglease.WithPeriod(period)),
	} {
		next, err := j.Claim(ctx, "k")
		if err == nil {
			t.Logf("%s claimed tick %v (%s) while the run of tick %v (%s) held the key", name, next.Tick(), next.Holder(), run.Tick(), run.Holder())
		}
		require.ErrorIs(t, err, pglease.ErrHeld, "%s: a claim of the next tick while the run of an earlier tick holds the key", name)
		if name != "its own Locker" {
			require.ErrorContains(t, err, "the run of tick "+run.Tick().UTC().Format(time.RFC3339Nano), name)
			require.ErrorContains(t, err, "still holds the key", name)
		}
	}
	require.NoError(t, run.Err(), "a run that outlasts its period keeps its lease")
	row, _ := readLegacyRow(t, pool, table, "k")
	assert.Equal(t, run.Holder(), row.Holder, "the row is the run's")
	assert.True(t, row.Live)
	require.NoError(t, lock.Unlock(ctx))
}

// Guarantee: without a fence column, each tick is taken at most once by
// claims of four replicas sent at once around the edge between two ticks,
// whatever the isolation level (a claim's read does not see a row inserted
// after its snapshot: the conflict arm judges it, after its lock).
func testWithoutFenceColumnAtMostOnceUnderConcurrentClaimsAtItsEdge(t *testing.T) {
	t.Parallel()
	for name, params := range map[string]map[string]string{
		"ReadCommitted": nil,
		"Serializable":  {"default_transaction_isolation": "serializable"},
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			const period = 200 * time.Millisecond
			table, dsn := legacyTable(t, legacyColumns) // the server's own DSN, never a pooler's
			var (
				mu    sync.Mutex
				taken = map[time.Time][]string{}
			)
			deadline := time.Now().Add(3 * time.Second)
			var wg sync.WaitGroup
			for i := range 4 {
				pool := pgtest.PoolWith(t, dsn, func(c *pgxpool.Config) {
					for k, v := range params {
						c.ConnConfig.RuntimeParams[k] = v
					}
				})
				l := pgtest.Locker(t, pool, table, fmt.Sprintf("r%d", i), pglease.WithoutFenceColumn(), pglease.WithTTL(time.Second),
					pglease.WithHeartbeatInterval(300*time.Millisecond))
				j := mustJob(t, l, pglease.WithPeriod(period))
				for g := range 3 {
					wg.Go(func() {
						for n := 0; time.Now().Before(deadline); n++ {
							// aim at the edge between two ticks (the midpoint)
							now := time.Now()
							edge := now.Truncate(period).Add(period / 2)
							if edge.Before(now) {
								edge = edge.Add(period)
							}
							jitter := time.Duration((i*3+g+n)%7-3) * time.Millisecond
							time.Sleep(time.Until(edge.Add(jitter)))
							lease, err := j.Claim(context.Background(), "k")
							if err != nil {
								continue
							}
							mu.Lock()
							taken[lease.Tick()] = append(taken[lease.Tick()], lease.Holder())
							mu.Unlock()
							if n%2 == 0 {
								time.Sleep(period + period/4) // a run held across the next edge
							}
							_ = lease.Unlock(context.Background())
						}
					})
				}
			}
			wg.Wait()
			mu.Lock()
			defer mu.Unlock()
			assert.NotEmpty(t, taken)
			for tick, holders := range taken {
				assert.Len(t, holders, 1, "tick %v taken by %v", tick, holders)
			}
			t.Logf("%d ticks taken", len(taken))
		})
	}
}

// Guarantee: without a fence column, a claim of a tick judges the row as it
// is once it has its lock: a claim whose read saw the row expired with no
// tick, then waited on the row while another transaction wrote that very
// tick in it (expired: a run released), takes nothing.
func testWithoutFenceColumnATickWrittenWhileTheClaimWaitsOnTheRowIsNotTakenAgain(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	admin := pgtest.Pool(t, nil)
	app := pgtest.AppName("tickwait")
	pool := pgtest.PoolWith(t, dsn, func(c *pgxpool.Config) { c.ConnConfig.RuntimeParams["application_name"] = app })
	period := fitPeriod(t, time.Hour, time.Minute, time.Minute) // one tick for the whole test
	_, err := admin.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, expires_at) VALUES ('k', 'old', clock_timestamp())`, table))
	require.NoError(t, err)
	var now time.Time
	require.NoError(t, admin.QueryRow(ctx, "SELECT clock_timestamp()").Scan(&now))
	tick := nearestTick(now, period)

	tx, err := admin.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(ctx) }()
	ran := "z#0123456789abcdef#0123456789abcdef@" + tick.UTC().Format(tickLayout)
	_, err = tx.Exec(ctx, fmt.Sprintf(`UPDATE %s SET holder = $1, expires_at = clock_timestamp() WHERE key = 'k'`, table), ran)
	require.NoError(t, err)

	j := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn()), pglease.WithPeriod(period))
	claimed := make(chan error, 1)
	go func() {
		lease, err := j.Claim(ctx, "k")
		if err == nil {
			err = fmt.Errorf("took tick %v as %s", lease.Tick(), lease.Holder())
		}
		claimed <- err
	}()
	pgtest.LockWaiter(t, admin, app, "WITH instant AS", 10*time.Second) // the claim of a tick, within what pg_stat_activity shows
	require.NoError(t, tx.Commit(ctx))
	err = <-claimed
	require.ErrorIs(t, err, pglease.ErrHeld, "the claim took the row of tick %v, written while it waited", tick)
	row, _ := readLegacyRow(t, pool, table, "k")
	assert.Equal(t, ran, row.Holder, "the row is untouched")
}

// Guarantee: without a fence column, the holder of a tick's lease is the
// holder forged for it, '@' and the tick in UTC to the microsecond, read
// back exactly: by the claims that refuse the tick once it was run, and by
// Admin.List, for ticks of a period with microseconds and of a crontab.
func testWithoutFenceColumnTheHolderCarriesTheTickExactly(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table), pglease.WithoutFenceColumn())
	require.NoError(t, err)
	const period = time.Hour + 1234567*time.Microsecond // ticks at every microsecond of the second
	for name, schedule := range map[string]pglease.Option{
		"Period": pglease.WithPeriod(period),
		"Cron":   pglease.WithCron("0 0,10 * * * *"),
	} {
		run, err := mustJob(t, pgtest.Locker(t, pool, table, "a"+name, pglease.WithoutFenceColumn()), schedule).Claim(ctx, name)
		require.NoError(t, err)
		if name == "Period" {
			require.Zero(t, run.Tick().UnixMicro()%period.Microseconds(), "tick %v is on the period's grid", run.Tick())
		}
		suffix := "@" + run.Tick().UTC().Format(tickLayout)
		require.True(t, strings.HasSuffix(run.Holder(), suffix), "%s: holder %q carries the tick %v", name, run.Holder(), run.Tick())
		assert.Regexp(t, `^a`+name+`#[0-9a-f]{16}#[0-9a-f]{16}$`, strings.TrimSuffix(run.Holder(), suffix), "the forged holder before it")
		row, _ := readLegacyRow(t, pool, table, name)
		require.Equal(t, run.Holder(), row.Holder)

		rows, err := admin.List(ctx)
		require.NoError(t, err)
		listed := false
		for _, r := range rows {
			if r.Key == name {
				listed = true
				assert.True(t, r.Tick.Equal(run.Tick()), "%s: List reads tick %v from the holder, the run's is %v", name, r.Tick, run.Tick())
			}
		}
		require.True(t, listed)

		require.NoError(t, run.Unlock(ctx))
		_, err = mustJob(t, pgtest.Locker(t, pool, table, "b"+name, pglease.WithoutFenceColumn()), schedule).Claim(ctx, name)
		require.ErrorIs(t, err, pglease.ErrHeld)
		// "already taken" only if the row's tick, read from its holder, is
		// no earlier than the tick asked.
		require.ErrorContains(t, err, "tick "+run.Tick().UTC().Format(time.RFC3339Nano)+" already taken", name)
	}
}

// Guarantee: without a fence column, the leases of ticks leave the other
// ways to a key working: a Guard of a run's lease commits; a plain claim of
// the key is ErrHeld while the run holds it, from another replica and from
// the run's own Locker (a plain claim is not re-entrant into a run of a
// tick, which would lose its lease); an Elector campaigning for the key
// takes it once the run is released.
func testWithoutFenceColumnPlainClaimsGuardAndElectorWorkOnRowsThatCarryATick(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	la := pgtest.Locker(t, pool, table, "a", pglease.WithoutFenceColumn())
	lb := pgtest.Locker(t, pool, table, "b", pglease.WithoutFenceColumn())
	run, err := mustJob(t, la, pglease.WithPeriod(time.Hour)).Claim(ctx, "k")
	require.NoError(t, err)
	require.Contains(t, run.Holder(), "@", "the run's holder carries its tick")

	tx, err := pool.Begin(ctx)
	require.NoError(t, err)
	require.NoError(t, run.Guard(ctx, tx), "a Guard of the run's lease")
	require.NoError(t, tx.Commit(ctx))

	for name, l := range map[string]*pglease.Locker{"another replica": lb, "its own Locker": la} {
		_, err := l.Claim(ctx, "k")
		require.ErrorIs(t, err, pglease.ErrHeld, "%s: a plain claim of the key while the run of a tick holds it", name)
	}
	require.NoError(t, run.Err(), "the run keeps its lease")
	row, _ := readLegacyRow(t, pool, table, "k")
	require.Equal(t, run.Holder(), row.Holder)

	e, err := pglease.NewElector(lb, "k")
	require.NoError(t, err)
	type result struct {
		lease *pglease.Lease
		err   error
	}
	led := make(chan result, 1)
	go func() {
		lease, err := e.Campaign(ctx)
		led <- result{lease, err}
	}()
	require.NoError(t, run.Unlock(ctx))
	r := <-led
	require.NoError(t, r.err, "the Elector takes the key once the run is released")
	assert.NotContains(t, r.lease.Holder(), "@", "a plain lease's holder carries no tick")
	row, _ = readLegacyRow(t, pool, table, "k")
	assert.Equal(t, r.lease.Holder(), row.Holder)
	assert.True(t, row.Live)
}

// Guarantee: without a fence column, a holder column too short for the
// holders of a job of ticks (the forged holder, '@' and the tick: 28
// characters more) refuses the job's claims with an error that says so,
// and writes nothing; plain claims go on, and a column that fits takes
// ticks.
func testWithoutFenceColumnHolderColumnTooShortForTicksIsRefused(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	const name = "replica-1"
	width := len(name) + 2*(1+16) + 1 + len(tickLayout)
	for _, fits := range []bool{false, true} {
		w := width
		if !fits {
			w--
		}
		table, dsn := legacyTable(t, fmt.Sprintf(`key text PRIMARY KEY, holder varchar(%d) NOT NULL, expires_at timestamptz NOT NULL`, w))
		pool := pgtest.PoolAt(t, dsn, nil)
		l := pgtest.Locker(t, pool, table, name, pglease.WithoutFenceColumn())
		plain, err := l.Claim(ctx, "plain")
		require.NoError(t, err, "a plain claim on a varchar(%d) holder column", w)
		require.NoError(t, plain.Unlock(ctx))
		run, err := mustJob(t, l, pglease.WithPeriod(time.Hour)).Claim(ctx, "job")
		if fits {
			require.NoError(t, err, "a varchar(%d) holder column takes the %d-character holders of a job of ticks", w, width)
			require.Equal(t, width, utf8.RuneCountInString(run.Holder()))
			require.NoError(t, run.Unlock(ctx))
			continue
		}
		require.Error(t, err)
		require.NotErrorIs(t, err, pglease.ErrHeld)
		require.ErrorContains(t, err, "column holder is character varying")
		require.ErrorContains(t, err, fmt.Sprintf("too short for the %d-character holders of a job of ticks", width))
		_, written := readLegacyRow(t, pool, table, "job")
		require.False(t, written, "nothing written")
	}
}

// Guarantee: WithCatchUp, which must tell a lapsed run from a released
// one, is refused WithoutFenceColumn (the table has no released_at) with an
// error that names it, why and the fix; a job of ticks without it is
// accepted.
func testWithoutFenceColumnCatchUpIsRefused(t *testing.T) {
	t.Parallel()
	l := pgtest.Locker(t, pgtest.Pool(t, nil), "never_claimed", "a", pglease.WithoutFenceColumn())
	for _, schedule := range []pglease.Option{pglease.WithPeriod(time.Second), pglease.WithCron("0 * * * *")} {
		_, err := l.Job(schedule, pglease.WithCatchUp())
		assert.Equal(t, "WithCatchUp", pglease.OptionNamed(err))
		require.ErrorContains(t, err, "cannot tell a lapsed run from a released one")
		require.ErrorContains(t, err, "run Migrate")
		_, err = l.Job(schedule)
		require.NoError(t, err, "a job of ticks without catch-up")
	}
}

// Guarantee: Admin.Runs of a table without a fence column, which has no
// ledger of runs, says so, with or without WithoutFenceColumn given to
// NewAdmin.
func testWithoutFenceColumnRunsSaysTheTableHasNoLedger(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	table, dsn := legacyTable(t, legacyColumns)
	pool := pgtest.PoolAt(t, dsn, nil)
	for _, opts := range [][]pglease.Option{{pglease.WithoutFenceColumn()}, nil} {
		admin, err := pglease.NewAdmin(pool, append([]pglease.Option{pglease.WithTable(table)}, opts...)...)
		require.NoError(t, err)
		_, err = admin.Runs(ctx, "", time.Hour)
		require.ErrorContains(t, err, "a table WithoutFenceColumn has no ledger of runs", "options %v", opts)
	}
}

// oldLocker is the older internal library a rolling deploy replaces: a plain
// holder, re-entrant by holder equality, released by expiring at now().
type oldLocker struct {
	pool   *pgxpool.Pool
	table  string
	holder string
}

type oldLock struct {
	*oldLocker
	key string
}

func (o *oldLocker) Lock(ctx context.Context, key string) (gocron.Lock, error) {
	tag, err := o.pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %[1]s AS t (key, holder, expires_at) VALUES ($1, $2, now() + interval '5 seconds')
		ON CONFLICT (key) DO UPDATE SET holder = EXCLUDED.holder, expires_at = EXCLUDED.expires_at
		WHERE t.holder = EXCLUDED.holder OR t.expires_at < now()`, o.table), key, o.holder)
	if err != nil {
		return nil, err
	}
	if tag.RowsAffected() == 0 {
		return nil, errors.New("held")
	}
	return oldLock{o, key}, nil
}

func (o oldLock) Unlock(ctx context.Context) error {
	_, err := o.pool.Exec(context.WithoutCancel(ctx), fmt.Sprintf(`UPDATE %s SET expires_at = now() WHERE key = $1 AND holder = $2`, o.table), o.key, o.holder)
	return err
}

func readLegacyRow(tb testing.TB, db pglease.DB, table, key string) (pgtest.Row, bool) {
	tb.Helper()
	var r pgtest.Row
	err := db.QueryRow(context.Background(), fmt.Sprintf(`SELECT holder, expires_at, expires_at > clock_timestamp() FROM %s WHERE key = $1`, table), key).
		Scan(&r.Holder, &r.ExpiresAt, &r.Live)
	if errors.Is(err, pgx.ErrNoRows) {
		return r, false
	}
	require.NoError(tb, err)
	return r, true
}

// scanGateDB holds the first claim after its row has been read, that is
// after it has committed, until released: the claim's mandate is then the
// row's, but the Locker has not registered it yet.
type scanGateDB struct {
	pglease.DB
	scanned chan struct{} // closed once the held claim has committed
	release chan struct{} // close to let the held claim return
	claims  atomic.Int32
}

type scanGateRow struct {
	pgx.Row
	db   *scanGateDB
	hold bool
}

func (d *scanGateDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	row := scanGateRow{Row: d.DB.QueryRow(ctx, sql, args...), db: d}
	if strings.HasPrefix(sql, "INSERT INTO") {
		row.hold = d.claims.Add(1) == 1
	}
	return row
}

func (r scanGateRow) Scan(dest ...any) error {
	err := r.Row.Scan(dest...)
	if r.hold {
		close(r.db.scanned)
		<-r.db.release
	}
	return err
}
