package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// lockedRows inserts n lapsed rows, locked-1 to locked-n, into table and
// locks them in a transaction it returns (pgtest.LockRows).
func lockedRows(ctx context.Context, t *testing.T, db pglease.DB, table string, n int) pgx.Tx {
	t.Helper()
	_, err := db.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		SELECT 'locked-' || g, 'old', now() - interval '2 hours', now() - interval '1 hour' FROM generate_series(1, %d) AS g`,
		pgx.Identifier{table}.Sanitize(), n))
	require.NoError(t, err)
	return pgtest.LockRows(t, db, table, `key LIKE 'locked-%'`)
}

// claimLockedRows claims locked-1 to locked-n on l, each in a goroutine of
// its own that releases the lease it gets; the channel receives the error
// of each (of its claim or of its release).
func claimLockedRows(ctx context.Context, l *pglease.Locker, n int) <-chan error {
	blocked := make(chan error, n)
	for i := range n {
		go func() {
			lease, err := l.Claim(ctx, fmt.Sprintf("locked-%d", i+1))
			if err == nil {
				err = lease.Unlock(ctx)
			}
			blocked <- err
		}()
	}
	return blocked
}

// TestBurst pins the coalesced claim: a burst of claims is one statement
// that hands each claim exactly the outcome it would have had alone, one
// winner per key, and a claim given up in flight gives its row back.
func TestBurst(t *testing.T) {
	t.Parallel()
	// Guarantee: a burst of claims whose commit's wait for a synchronous
	// standby was cut short (every caller gave up, a cancel request ended
	// the wait, the server reported success) hands out no lease, on every
	// kind of DB; its rows are given back.
	t.Run("UnreplicatedCommitIsNotALease", func(t *testing.T) {
		t.Parallel()
		ctx, _, pool, table := pgtest.UnreplicatedSetup(t)
		for name, on := range unreplicatedDBs(ctx, t, pool) {
			t.Run(name, func(t *testing.T) {
				l := on.locker(t, table, name, pglease.WithTTL(30*time.Second))
				keys := make([]string, 6)
				for i := range keys {
					keys[i] = fmt.Sprintf("%s-job-%d", name, i)
				}
				cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
				leases, errs := pglease.ClaimBurst(cctx, l, keys)
				cancel()
				for i, key := range keys {
					require.Error(t, errs[i], "%s: a claim whose commit was not replicated was handed out", key)
					require.ErrorIs(t, errs[i], context.DeadlineExceeded)
					require.Nil(t, leases[i])
				}
				requireNoLiveRowOf(t, pool, table, name, 5*time.Second, keys...)
			})
		}
	})
	// Guarantee: coalesced claims of many keys against contending Lockers have
	// one winner per key and fences that only grow.
	t.Run("OneWinnerPerKeyAndGrowingFences", func(t *testing.T) {
		t.Parallel()
		ctx, setup, table := pgtest.Setup(t)
		const replicas, keys, rounds = 3, 40, 5
		counters := make([]*pgtest.Statements, replicas)
		lockers := make([]*pglease.Locker, replicas)
		for i := range lockers {
			counters[i] = &pgtest.Statements{}
			lockers[i] = pgtest.Locker(t, pgtest.Pool(t, counters[i]), table, fmt.Sprintf("r%d", i))
		}
		names := make([]string, keys)
		for i := range names {
			names[i] = fmt.Sprintf("job-%02d", (i*7)%keys) // not in key order
		}

		lastFence := map[string]int64{}
		for round := range rounds {
			leases := make([][]*pglease.Lease, replicas)
			errs := make([][]error, replicas)
			var wg sync.WaitGroup
			for i, l := range lockers {
				counters[i].Reset()
				wg.Go(func() { leases[i], errs[i] = pglease.ClaimBurst(ctx, l, names) })
			}
			wg.Wait()

			won := make([][]*pglease.Lease, replicas)
			for k, key := range names {
				var winners []*pglease.Lease
				for i := range lockers {
					if err := errs[i][k]; err != nil {
						require.ErrorIs(t, err, pglease.ErrHeld, "round %d key %s replica %d", round, key, i)
						continue
					}
					winners = append(winners, leases[i][k])
					won[i] = append(won[i], leases[i][k])
				}
				require.Len(t, winners, 1, "round %d key %s: exactly one winner", round, key)
				w := winners[0]
				require.NoError(t, w.Err(), "the winner's lease is held")
				row, ok := pgtest.ReadRow(t, setup, table, key)
				require.True(t, ok)
				require.Equal(t, w.Holder(), row.Holder)
				require.Equal(t, w.Fence(), row.Fence)
				require.Greater(t, w.Fence(), lastFence[key], "fences of %s only grow", key)
				lastFence[key] = w.Fence()
			}
			for i, l := range lockers {
				require.Equal(t, 1, counters[i].Count("claim"), "replica %d: the burst of %d claims is one statement", i, keys)
				if len(won[i]) > 0 {
					counters[i].Reset()
					for _, err := range pglease.UnlockBurst(ctx, l, won[i]) {
						require.NoError(t, err)
					}
					require.Equal(t, 1, counters[i].Count("release"), "replica %d: its %d unlocks are one statement", i, len(won[i]))
				}
			}
			require.Zero(t, liveRows(t, setup, table), "every lease released")
		}
	})

	// Guarantee: a burst gives a repeated key, a re-entrant claim, a locked row
	// and a bad row each its own outcome.
	t.Run("EachClaimGetsItsOwnOutcome", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		ident := pgx.Identifier{table}.Sanitize()
		_, err := pool.Exec(ctx, fmt.Sprintf(`ALTER TABLE %s ADD CONSTRAINT no_bad CHECK (key <> 'bad')`, ident))
		require.NoError(t, err)
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(events.Hook))
		other := pgtest.Locker(t, pool, table, "b")

		before, err := l.Claim(ctx, "reentrant")
		require.NoError(t, err)
		_, err = other.Claim(ctx, "held")
		require.NoError(t, err)
		// "a-locked": a lapsed row of another holder, locked by an open
		// transaction; it sorts first, so the burst statement waits on it.
		_, err = pool.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		VALUES ('a-locked', 'b', now() - interval '2 hours', now() - interval '1 hour')`, ident))
		require.NoError(t, err)
		tx := pgtest.LockRows(t, pool, table, `key = 'a-locked'`)

		keys := []string{"free", "dup", "reentrant", "held", "a-locked", "bad", "dup"}
		type burst struct {
			leases []*pglease.Lease
			errs   []error
		}
		done := make(chan burst, 1)
		go func() {
			leases, errs := pglease.ClaimBurst(ctx, l, keys)
			done <- burst{leases, errs}
		}()
		// Every claim but the locked row's gets its outcome while the row is
		// still locked: two acquisitions of dup, free and reentrant.
		for range 4 {
			events.WaitFor(t, pglease.EventAcquired, 10*time.Second)
		}
		require.NoError(t, tx.Commit(ctx))
		b := <-done

		outcome := map[string][]error{}
		leases := map[string][]*pglease.Lease{}
		for i, key := range keys {
			outcome[key] = append(outcome[key], b.errs[i])
			leases[key] = append(leases[key], b.leases[i])
		}
		require.NoError(t, outcome["free"][0])
		require.NoError(t, outcome["a-locked"][0], "the locked row is taken once the lock is gone")
		require.ErrorIs(t, outcome["held"][0], pglease.ErrHeld)
		var pgErr *pgconn.PgError
		require.ErrorAs(t, outcome["bad"][0], &pgErr)
		require.Equal(t, "23514", pgErr.Code, "the bad row fails with its own cause")
		_, ok := pgtest.ReadRow(t, pool, table, "bad")
		require.False(t, ok)

		require.NoError(t, outcome["reentrant"][0])
		require.Greater(t, leases["reentrant"][0].Fence(), before.Fence(), "re-entrant: a greater fence")
		require.ErrorIs(t, before.Err(), pglease.ErrLost, "the previous mandate is lost")

		require.NoError(t, outcome["dup"][0])
		require.NoError(t, outcome["dup"][1])
		first, second := leases["dup"][0], leases["dup"][1]
		if first.Fence() > second.Fence() {
			first, second = second, first
		}
		require.ErrorIs(t, first.Err(), pglease.ErrLost, "the earlier claim of dup was re-claimed")
		require.NoError(t, second.Err())
		held, ok := l.Held("dup")
		require.True(t, ok)
		require.Same(t, second, held, "the lease held is the row's")
		row, _ := pgtest.ReadRow(t, pool, table, "dup")
		require.Equal(t, second.Fence(), row.Fence)
	})

	// Guarantee: every claim outcome is reported in a burst exactly as it is for
	// a claim alone.
	t.Run("ReportsEachOutcomeAsAlone", func(t *testing.T) {
		t.Parallel()
		for name, claim := range claimPaths {
			t.Run(name, func(t *testing.T) {
				t.Parallel()
				t.Run("WonHeldAndReentrant", func(t *testing.T) {
					t.Parallel()
					ctx, pool, table := pgtest.Setup(t)
					l := pgtest.Locker(t, pool, table, "a")
					other := pgtest.Locker(t, pool, table, "b")
					mine, err := l.Claim(ctx, "mine")
					require.NoError(t, err)
					_, err = other.Claim(ctx, "theirs")
					require.NoError(t, err)

					leases, errs := claim(ctx, l, []string{"new", "mine", "theirs", "filler"})
					require.NoError(t, errs[0])
					require.NoError(t, leases[0].Err())
					require.NoError(t, errs[1])
					require.Greater(t, leases[1].Fence(), mine.Fence())
					require.ErrorIs(t, mine.Err(), pglease.ErrLost)
					require.ErrorIs(t, errs[2], pglease.ErrHeld)
					require.Nil(t, leases[2])
					row, _ := pgtest.ReadRow(t, pool, table, "new")
					require.Equal(t, leases[0].Fence(), row.Fence)
					require.Equal(t, row.AcquiredAt, leases[0].AcquiredAt())
					require.Equal(t, row.ExpiresAt, leases[0].ExpiresAt())
					require.Equal(t, time.Minute, row.ExpiresAt.Sub(row.AcquiredAt), "expires_at and acquired_at from one clock reading")
				})
				t.Run("PastTheTrustWindow", func(t *testing.T) {
					t.Parallel()
					ctx, pool, table := pgtest.Setup(t)
					db := pgtest.NewFaultyDB(pool)
					const ttl = 300 * time.Millisecond
					l := pgtest.Locker(t, db, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
					open := db.Hold("claim")
					done := make(chan []error, 1)
					go func() {
						_, errs := claim(ctx, l, []string{"k1", "k2"})
						done <- errs
					}()
					<-db.Entered
					time.Sleep(ttl) // the point of the test: a statement on its way longer than the trust window
					open()
					errs := <-done
					if name == "alone" {
						errs = errs[:1] // the second claim was sent after the hold
					}
					for _, err := range errs {
						require.ErrorIs(t, err, pglease.ErrLost)
						require.ErrorContains(t, err, "longer than the trust window")
					}
					_, ok := l.Held("k1")
					require.False(t, ok)
				})
				t.Run("ExpiredWhileWaitingOnTheRowLock", func(t *testing.T) {
					t.Parallel()
					ctx, pool, table := pgtest.Setup(t)
					const ttl = 500 * time.Millisecond
					l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
					first, err := l.Claim(ctx, "k")
					require.NoError(t, err)
					require.NoError(t, first.Unlock(ctx))
					tx := pgtest.LockRows(t, pool, table, `key = 'k'`)
					done := make(chan []error, 1)
					go func() {
						_, errs := claim(ctx, l, []string{"k", "other"})
						done <- errs
					}()
					require.Eventually(t, func() bool {
						var waiting bool
						_ = pool.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock'
							AND query LIKE 'INSERT INTO%' AND query NOT LIKE '%unnest%' AND strpos(query, $1) > 0)`, table).Scan(&waiting)
						return waiting
					}, 10*time.Second, 10*time.Millisecond, "the claim of k waits alone on the row lock")
					time.Sleep(2 * ttl) // the point of the test: a wait longer than the TTL
					require.NoError(t, tx.Commit(ctx))
					errs := <-done
					require.ErrorIs(t, errs[0], pglease.ErrLost)
					require.ErrorContains(t, errs[0], "expired while waiting on the row lock")
					require.NoError(t, errs[1], "the other claim is unaffected")
				})
				t.Run("StatementFailed", func(t *testing.T) {
					t.Parallel()
					ctx, pool, table := pgtest.Setup(t)
					db := pgtest.NewFaultyDB(pool)
					l := pgtest.Locker(t, db, table, "a")
					cause := errors.New("connection reset by peer")
					db.SetFail("claim", cause)
					leases, errs := claim(ctx, l, []string{"k1", "k2"})
					for i, err := range errs {
						require.ErrorIs(t, err, cause, "each claim with the cause")
						require.Nil(t, leases[i])
					}
					db.SetFail("claim", nil)
					_, errs = claim(ctx, l, []string{"k1", "k2"})
					for _, err := range errs {
						require.NoError(t, err, "the next claims work")
					}
				})
			})
		}
	})

	// Guarantee: the burst's statement keeps the claim's conflict arm, guard
	// and RETURNING as they are: a burst must hand out exactly what the same
	// claims alone would.
	t.Run("StatementJudgesRowsAsAClaimAlone", func(t *testing.T) {
		t.Parallel()
		tail := func(sql string) string {
			_, after, ok := strings.Cut(sql, "ON CONFLICT")
			if !ok {
				t.Fatalf("no ON CONFLICT in %s", sql)
			}
			return after
		}
		alone := tail(sqlstmt.Claim)
		burst := strings.Replace(tail(sqlstmt.ClaimAll), "RETURNING key, ", "RETURNING ", 1)
		if alone != burst {
			t.Fatalf("claimAllSQL judges rows differently from claimSQL:\nalone:\n%s\nburst:\n%s", alone, burst)
		}
	})

	// Guarantee: a claim whose caller gave up while its burst was in flight
	// gives its row back, and its key's turn.
	t.Run("GivenUpClaimGivesItsRowBack", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := pgtest.NewFaultyDB(pool)
		l := pgtest.Locker(t, db, table, "a")
		open := db.Hold("claim")
		short, cancel := context.WithCancel(ctx)
		done := make(chan []error, 1)
		go func() {
			_, errs := pglease.ClaimBurstEach([]context.Context{short, ctx}, l, []string{"gone", "stays"})
			done <- errs
		}()
		<-db.Entered // the burst statement is on its way
		cancel()
		open()
		errs := <-done
		require.ErrorIs(t, errs[0], context.Canceled)
		require.NoError(t, errs[1], "a caller giving up fails no other claim of its statement")

		// The claim of "gone" won, and nobody holds it: its row is given back,
		// then its key's turn, so that the next claims of the key go through.
		other := pgtest.Locker(t, pool, table, "b")
		require.Eventually(t, func() bool {
			_, err := other.Claim(ctx, "gone")
			return err == nil
		}, 10*time.Second, 20*time.Millisecond, "the abandoned row is given back, not left to its expiry")
		_, err := l.Claim(ctx, "gone")
		require.ErrorIs(t, err, pglease.ErrHeld, "the key's turn is free again")
	})

	// Guarantee: bursts of two Lockers over the same keys in opposite orders do
	// not deadlock.
	t.Run("OppositeOrdersDoNotDeadlock", func(t *testing.T) {
		t.Parallel()
		ctx, setup, table := pgtest.Setup(t)
		const n = 300
		// Expired rows of a third holder: each burst's conflict arm locks every
		// row it reaches, and waits on those the other has locked.
		_, err := setup.Exec(ctx, fmt.Sprintf(`INSERT INTO %s (key, holder, acquired_at, expires_at)
		SELECT 'k' || lpad(g::text, 4, '0'), 'old', now() - interval '2 hours', now() - interval '1 hour'
		  FROM generate_series(1, $1::int) AS g`, pgx.Identifier{table}.Sanitize()), n)
		require.NoError(t, err)
		up, down := make([]string, n), make([]string, n)
		for i := range n {
			up[i] = fmt.Sprintf("k%04d", i+1)
			down[n-1-i] = up[i]
		}
		ca, cb := &pgtest.Statements{}, &pgtest.Statements{}
		a := pgtest.Locker(t, pgtest.Pool(t, ca), table, "a")
		b := pgtest.Locker(t, pgtest.Pool(t, cb), table, "b")
		each := func(ctx context.Context) []context.Context {
			ctxs := make([]context.Context, n)
			for i := range ctxs {
				ctxs[i] = ctx
			}
			return ctxs
		}
		sendA := pglease.PrepareClaimBurst(each(ctx), a, up)
		sendB := pglease.PrepareClaimBurst(each(ctx), b, down)
		ca.Reset()
		cb.Reset()
		var errsA, errsB []error
		var wg sync.WaitGroup
		wg.Go(func() { _, errsA = sendA() })
		wg.Go(func() { _, errsB = sendB() })
		wg.Wait()

		for i, key := range up {
			errA, errB := errsA[i], errsB[n-1-i]
			won := 0
			for _, err := range []error{errA, errB} {
				if err == nil {
					won++
				} else {
					require.ErrorIs(t, err, pglease.ErrHeld, "key %s", key)
				}
			}
			require.Equal(t, 1, won, "key %s: exactly one winner", key)
		}
		// A deadlock would have failed one statement (SQLSTATE 40P01) after
		// deadlock_timeout and sent its claims again one by one.
		require.Equal(t, 1, ca.Count("claim"), "a's burst is one statement")
		require.Equal(t, 1, cb.Count("claim"), "b's burst is one statement")
	})

	// Guarantee: claims waiting on rows locked elsewhere do not hold up the
	// Locker's other claims.
	t.Run("LockedRowsHoldUpNoOtherClaim", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pgtest.Pool(t, nil), table, "a")
		// Six lapsed rows (the pool has 8 connections), locked by an open
		// transaction: each claim of one
		// waits on its lock, as a claim alone always has.
		tx := lockedRows(ctx, t, pool, table, 6)

		blocked := make(chan error, 6)
		for i := range 6 {
			go func() {
				_, err := l.Claim(ctx, fmt.Sprintf("locked-%d", i+1))
				blocked <- err
			}()
		}
		require.Eventually(t, func() bool {
			var n int
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'`).Scan(&n)
			return n >= 4
		}, 10*time.Second, 10*time.Millisecond, "claims wait on the locked rows")

		// Every place in flight is taken by a claim that waits; others go on.
		got := make(chan error, 1)
		go func() {
			_, err := l.Claim(ctx, "free")
			got <- err
		}()
		select {
		case err := <-got:
			require.NoError(t, err)
		case <-time.After(10 * time.Second):
			t.Fatal("the claim of a free key waited for rows locked elsewhere")
		}
		require.NoError(t, tx.Commit(ctx))
		for range 6 {
			require.NoError(t, <-blocked, "each waiting claim takes its row once the lock is gone")
		}
	})

	// Guarantee: a claim of a free key is never held up by claims waiting on
	// rows locked elsewhere, even when they are more than the connections
	// claims may hold: with pgxpool's smallest default pool (4 connections,
	// 3 for claims), claims of four rows an open transaction holds do not
	// keep the claim of a free key waiting, which takes its lease while they
	// still wait, and each of them takes its row once the lock is gone.
	t.Run("FreeKeyNotHeldUpByLockedRows", func(t *testing.T) {
		t.Parallel()
		ctx, direct, table := pgtest.Setup(t)
		app := pgtest.AppName("freekey")
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) {
			c.MaxConns = 4
			c.ConnConfig.RuntimeParams["application_name"] = app
		})
		l := pgtest.Locker(t, pool, table, "a")
		tx := lockedRows(ctx, t, direct, table, 4)
		blocked := claimLockedRows(ctx, l, 4)
		require.Eventually(t, func() bool {
			var n int
			_ = direct.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE application_name = $1 AND wait_event_type = 'Lock' AND query LIKE 'INSERT INTO%'`, app).Scan(&n)
			return n == 3
		}, 10*time.Second, 2*time.Millisecond, "claims wait on the locked rows on every connection claims may hold")

		// Far more than a claim's wait on a row lock, far less than the
		// locks are held: before, it waited as long as they were.
		fctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		defer cancel()
		start := time.Now()
		lease, err := l.Claim(fctx, "free")
		require.NoError(t, err, "the claim of a free key, while claims of locked rows wait")
		t.Logf("figures: the claim of a free key took %v, four claims of locked rows waiting", time.Since(start).Round(time.Millisecond))
		require.Empty(t, blocked, "the claims of the locked rows still wait")
		require.NoError(t, lease.Unlock(ctx))

		require.NoError(t, tx.Commit(ctx))
		for range 4 {
			require.NoError(t, <-blocked, "each waiting claim takes its row once the lock is gone")
		}
	})

	// Guarantee: a burst claims every free key of it even when the session's
	// statement_timeout is shorter than the burst's wait on a locked row: the
	// timeout cancels the burst's statement (SQLSTATE 57014) like a row locked
	// past the lock wait, and each claim then goes alone, so that only the
	// claim of the locked row fails.
	t.Run("ShortStatementTimeoutClaimsEveryFreeKey", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(c *pgxpool.Config) {
			c.ConnConfig.RuntimeParams["statement_timeout"] = "150ms"
		})
		table := pgtest.Table(t, pgtest.Pool(t, nil)) // the DDL is the deploy's, not the subject
		old := pgtest.Locker(t, pool, table, "old")
		lease, err := old.Claim(ctx, "b")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
		pgtest.LockRows(t, pool, table, `key = 'b'`)

		l := pgtest.Locker(t, pool, table, "a")
		leases, errs := pglease.ClaimBurst(ctx, l, []string{"a", "b", "c"})
		require.NoError(t, errs[0], "free key a")
		require.Error(t, errs[1], "b is locked past the statement timeout")
		require.NoError(t, errs[2], "free key c")
		require.NoError(t, leases[0].Unlock(ctx))
		require.NoError(t, leases[2].Unlock(ctx))
	})
}

// claimPath claims keys on l alone (one Claim after the other) or in one
// burst statement.
type claimPath func(ctx context.Context, l *pglease.Locker, keys []string) ([]*pglease.Lease, []error)

var claimPaths = map[string]claimPath{
	"alone": func(ctx context.Context, l *pglease.Locker, keys []string) ([]*pglease.Lease, []error) {
		leases, errs := make([]*pglease.Lease, len(keys)), make([]error, len(keys))
		for i, key := range keys {
			leases[i], errs[i] = l.Claim(ctx, key)
		}
		return leases, errs
	},
	"burst": pglease.ClaimBurst,
}

// sqlLog is a pgx tracer that records the text of every statement sent.
type sqlLog struct {
	mu   sync.Mutex
	sent []string
}

func (s *sqlLog) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sent = append(s.sent, data.SQL)
	return ctx
}

func (s *sqlLog) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// count is how many of the statements sent were sql.
func (s *sqlLog) count(sql string) int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, x := range s.sent {
		if x == sql {
			n++
		}
	}
	return n
}

// TestCoalesceAll proves the switch of PGLEASE_COALESCE_ALL (main_test.go):
// with it, a claim or a release alone goes through the burst's statement,
// in every Locker and Elector the tests build; without it, each has the
// statement of its own.
func TestCoalesceAll(t *testing.T) {
	t.Parallel()
	// counts is how many claim statements alone, burst claim statements,
	// release statements alone and burst release statements a test sent.
	type counts struct{ alone, burst, releaseAlone, release int }
	setup := func(t *testing.T) (context.Context, *pgxpool.Pool, string, *sqlLog, func() counts) {
		t.Helper()
		log := &sqlLog{}
		ctx, pool := pgtest.Ctx(t), pgtest.Pool(t, log)
		table := pgtest.Table(t, pool)
		name := pgx.Identifier{table}
		return ctx, pool, table, log, func() counts {
			return counts{
				alone:        log.count(sqlstmt.Render(sqlstmt.Claim, name)),
				burst:        log.count(sqlstmt.Render(sqlstmt.ClaimAll, name)),
				releaseAlone: log.count(sqlstmt.Render(sqlstmt.ReleaseOne, name)),
				release:      log.count(sqlstmt.Render(sqlstmt.Release, name)),
			}
		}
	}
	// claimOnce claims and releases one key alone.
	claimOnce := func(t *testing.T, ctx context.Context, l *pglease.Locker) {
		t.Helper()
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		require.NoError(t, lease.Unlock(ctx))
	}
	want := func(on bool) counts {
		if on {
			return counts{burst: 1, release: 1}
		}
		return counts{alone: 1, releaseAlone: 1}
	}

	t.Run("FollowsTheTestsSwitch", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, _, sent := setup(t)
		claimOnce(t, ctx, pgtest.Locker(t, pool, table, "a"))
		require.Equal(t, want(coalesceAll), sent(), "PGLEASE_COALESCE_ALL set: %v", coalesceAll)
	})

	for name, on := range map[string]bool{"On": true, "Off": false} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table, _, sent := setup(t)
			l := pgtest.Locker(t, pool, table, "a")
			pglease.SetCoalesceAll(l, on)
			claimOnce(t, ctx, l)
			require.Equal(t, want(on), sent())
		})
	}

	t.Run("ReachesElectors", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table, _, sent := setup(t)
		e := newElector(t, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet)})
		require.NoError(t, e.IsLeader(ctx))
		require.NoError(t, e.Close(ctx))
		got := sent()
		require.Equal(t, want(coalesceAll), got)
	})
}

// TestOrphanedClaim is the claim whose caller gave up while its burst's
// statement was in flight (orphanClaim): the coalescer settles it once the
// statement returns.
func TestOrphanedClaim(t *testing.T) {
	t.Parallel()

	// Close waits for the orphan's give-back: it returns only once the
	// row is released, and no statement of the Locker runs after it.
	t.Run("GiveBackFinishesBeforeClose", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		f := pgtest.NewFaultyDB(pool)
		events := pgtest.NewEvents(t)
		a := pgtest.Each(pglease.NewLocker(f, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet), pglease.WithHook(events.Hook)))
		b := pgtest.Locker(t, pool, table, "b")
		_, err := b.Claim(ctx, "x") // x is held elsewhere: its claim in the burst wins nothing
		require.NoError(t, err)

		releaseClaims := f.Hold("claim")
		defer releaseClaims()
		kctx, cancelK := context.WithCancel(ctx)
		defer cancelK()
		send := pglease.PrepareClaimBurst([]context.Context{kctx, ctx}, a, []string{"k", "x"})
		done := make(chan struct{})
		go func() { send(); close(done) }()
		<-f.Entered
		cancelK()
		ev := events.WaitFor(t, pglease.EventClaimFailed, 10*time.Second)
		require.Equal(t, "k", ev.Key)
		releaseReleases := f.Hold("release") // the orphan's give-back will wait here
		defer releaseReleases()
		releaseClaims()
		<-done // x: ErrHeld; k: orphaned, won, and being given back
		select {
		case <-f.Entered:
		case <-ctx.Done():
			t.Fatal("the orphan's release never came")
		}
		closeErr := make(chan error, 1)
		go func() { closeErr <- a.Close(ctx) }() // a holds no lease of its own
		select {
		case err := <-closeErr:
			t.Fatalf("Close returned (%v) while the orphan's give-back was still in its statement", err)
		case <-time.After(300 * time.Millisecond):
		}
		releaseReleases()
		require.NoError(t, <-closeErr)
		row, _ := pgtest.ReadRow(t, pool, table, "k")
		require.False(t, row.Live, "the orphan's give-back of k (fence %d) ran before Close returned", row.Fence)
	})

	// A re-entrant orphaned claim (the Locker already held the key) ends
	// the previous lease before its give-back frees the row: another holder
	// that then takes the key never overlaps a lease Held still hands out.
	t.Run("ReentrantEndsThePreviousLeaseFirst", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		f := pgtest.NewFaultyDB(pool)
		events := pgtest.NewEvents(t)
		a := pgtest.Locker(t, f, table, "a", pglease.WithTTL(30*time.Second), pglease.WithHook(events.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithTTL(30*time.Second))

		first, err := a.Claim(ctx, "k")
		require.NoError(t, err)

		release := f.Hold("claim")
		defer release()
		kctx, cancelK := context.WithCancel(ctx)
		defer cancelK()
		send := pglease.PrepareClaimBurst([]context.Context{kctx, ctx}, a, []string{"k", "x"})
		type result struct {
			leases []*pglease.Lease
			errs   []error
		}
		got := make(chan result, 1)
		go func() { ls, es := send(); got <- result{ls, es} }()
		select {
		case <-f.Entered: // the burst's statement is on its way
		case <-ctx.Done():
			t.Fatal("burst never sent")
		}
		cancelK()                                                         // the caller of k gives up while its claim is in the statement
		ev := events.WaitFor(t, pglease.EventClaimFailed, 10*time.Second) // Claim(k) has returned its error
		require.Equal(t, "k", ev.Key)
		release()
		r := <-got
		require.Error(t, r.errs[0], "the cancelled re-entrant claim reports an error")
		require.NoError(t, r.errs[1])

		require.Eventually(t, func() bool {
			row, ok := pgtest.ReadRow(t, pool, table, "k")
			return ok && !row.Live
		}, 10*time.Second, 20*time.Millisecond, "the orphan's give-back never expired row k")
		other, err := b.Claim(ctx, "k")
		require.NoError(t, err, "another holder takes k once the orphan freed it")
		held, ok := a.Held("k")
		if ok || first.Err() == nil {
			t.Fatalf("mutual exclusion broken: b holds k (fence %d) while a's previous lease (fence %d) is still trusted: Held=%v Err=%v",
				other.Fence(), first.Fence(), ok && held == first, first.Err())
		}
		require.ErrorIs(t, first.Err(), pglease.ErrLost)
	})
}
