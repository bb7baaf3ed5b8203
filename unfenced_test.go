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
		perTick := runSkewedSchedulersOn(t, dsn, table, ticks, pglease.WithoutFenceColumn(), pglease.WithMinHold(600*time.Millisecond))
		for k := 0; k < ticks; k++ {
			assert.Equal(t, 1, perTick[k], "tick %d runs exactly once", k)
		}
	})

	// Guarantee: a rolling deploy alongside old replicas that hold plainly never
	// runs a tick twice.
	t.Run("RollingDeployNeverRunsATickTwice", func(t *testing.T) {
		t.Parallel()
		table, dsn := legacyTable(t, legacyColumns)
		const period, ticks = time.Second, 8
		log := newRunLog()
		skews := []time.Duration{0, 100 * time.Millisecond, 200 * time.Millisecond, 300 * time.Millisecond}
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
		scheds := map[string]gocron.Scheduler{}
		for i, skew := range skews {
			name, locker := names[i], lockers[i]
			s, err := gocron.NewScheduler(gocron.WithDistributedLocker(locker))
			require.NoError(t, err)
			t.Cleanup(func() { _ = s.Shutdown() })
			scheds[name] = s
			_, err = s.NewJob(gocron.DurationJob(period), gocron.NewTask(func() {
				x := run{replica: name, start: time.Now()}
				log.started <- x
				time.Sleep(400 * time.Millisecond) // longer than the skew: replicas contend while it runs
				x.end = time.Now()
				log.add(x)
			}), gocron.WithName("report"), gocron.WithStartAt(gocron.WithStartDateTime(base.Add(skew))))
			require.NoError(t, err)
			s.Start()
		}
		tickOf := func(at time.Time) int { return int(at.Sub(base.Add(-100*time.Millisecond)) / period) }
		limit := time.After((ticks + 5) * period)
		for done := false; !done; {
			select {
			case x := <-log.started:
				done = tickOf(x.start) > ticks
				if tickOf(x.start) == ticks/2 && x.replica == "old-0" {
					// The deploy goes on: the old replica that fires first is
					// replaced, so new ones take the ticks from now on.
					wg.Go(func() { _ = scheds["old-0"].Shutdown() })
				}
			case <-limit:
				t.Fatal("the schedulers stopped ticking")
			}
		}
		// Shutdown returns once the runs in progress have ended: every run
		// that started is then in the log, and no other starts.
		for _, s := range scheds {
			wg.Go(func() { _ = s.Shutdown() })
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
	t.Run("ConcurrentReentrantClaimsKeepTheMandate", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table, dsn := legacyTable(t, legacyColumns)
		pool := pgtest.PoolAt(t, dsn, nil)
		other := pgtest.Locker(t, pool, table, "replica-2", pglease.WithoutFenceColumn())
		opts := []pglease.Option{pglease.WithoutFenceColumn(), pglease.WithHeartbeatInterval(100 * time.Millisecond)}

		// requireRowsMandate checks that the lease l holds is the row's, and
		// that its Unlock frees the key for another holder at once.
		requireRowsMandate := func(l *pglease.Locker, key string) {
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
		requireRowsMandate(l, "forced")

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
			requireRowsMandate(l, key)
		}
	})
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
