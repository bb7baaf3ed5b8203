package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgconn/ctxwatch"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgtest"
)

// answerGrace mirrors the Locker's bound on the wait for the server's answer
// to a cancel request.
const answerGrace = time.Second

// claimsRunning counts the claim statements of application app (of any
// application when app is empty) still running on the server.
func claimsRunning(ctx context.Context, t *testing.T, pool pglease.DB, app string) int {
	t.Helper()
	var n int
	require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
		WHERE pid <> pg_backend_pid() AND state = 'active' AND ($1::text = '' OR application_name = $1)
		AND strpos(query, 'pglease.synchronous_commit') > 0`, app).Scan(&n))
	return n
}

// bystander runs stmt on db again and again, as another client of the
// server, until stop, which waits for it and returns how many of its
// statements ran and how many were cancelled (57014).
func bystander(ctx context.Context, db pglease.DB, stmt string) (stop func() (ran, cancelled int64)) {
	bctx, cancel := context.WithCancel(ctx)
	var n, c atomic.Int64
	done := make(chan struct{})
	go func() {
		defer close(done)
		for bctx.Err() == nil {
			_, err := db.Exec(bctx, stmt)
			var pgErr *pgconn.PgError
			if errors.As(err, &pgErr) && pgErr.Code == "57014" {
				c.Add(1)
			}
			n.Add(1)
		}
	}()
	return func() (int64, int64) {
		cancel()
		<-done
		return n.Load(), c.Load()
	}
}

// goroutineStacks is the stack of every goroutine, by function name.
func goroutineStacks() string {
	var b strings.Builder
	_ = pprof.Lookup("goroutine").WriteTo(&b, 1)
	return b.String()
}

// TestClaimCancel pins what becomes of a claim whose caller gives up while
// its statement runs: it is cancelled on the server and its answer read,
// the caller returns promptly and sees why, no live row is left that
// nobody holds, and the cancel request reaches no other statement.
func TestClaimCancel(t *testing.T) {
	t.Parallel()

	// Guarantee: a claim whose first cancel request reaches the server
	// before its statement does still returns promptly, with its context's
	// error, no statement running and no live row, and its error says what
	// the server answered. Through a link with 200 ms of latency, on a
	// connection the claim statement was never prepared on, pgx first
	// prepares it (one round trip) and only then sends it. The caller gives
	// up during the prepare: the first cancel request reaches the backend
	// while it idles between the two, which the server ignores. A claim
	// alone waits on the row lock without bound: only the requests sent
	// again every cancelResend end it, and its error says the server
	// cancelled it (a 57014). A claim through the burst's statement carries
	// a lock wait of its own, which may end it first: its error then says
	// the row was locked past that wait (55P03), never that the server
	// cancelled it; either way the server answered, and nothing was written.
	t.Run("SentBeforeTheStatement", func(t *testing.T) {
		t.Parallel()
		for _, burst := range []bool{false, true} {
			// One after the other: each needs its round trips on time.
			t.Run(map[bool]string{false: "Alone", true: "ThroughTheBurstStatement"}[burst], func(t *testing.T) {
				// The case needs the claim on a connection within its 100 ms:
				// a claim the machine held up past them never took one, sent
				// nothing and tells nothing, so it runs again, three times at
				// most.
				for attempt := 1; ; attempt++ {
					ctx, pool, table := pgtest.Setup(t)
					freeRow(ctx, t, pool, table, "job")

					p := pgtest.Proxy(t, "")
					app := pgtest.AppName("cancelearly")
					slow := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
						cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Host(), p.Port()
						cfg.ConnConfig.RuntimeParams["application_name"] = app
						cfg.MaxConns = 4
						// The idle connection goes to the claim as it is: pgxpool
						// pings one idle for over a second first, a round trip
						// through the slowed link that outlasts the claim's
						// deadline on a busy machine.
						cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false }
					})
					require.NoError(t, slow.Ping(ctx)) // one idle connection, nothing prepared on it
					l := pgtest.Locker(t, slow, table, "claimer")
					pglease.SetCoalesceAll(l, burst)
					require.NoError(t, l.CheckTable(ctx)) // the Locker's one read of its table, before the link slows
					p.SetLatency(200*time.Millisecond, 0, 1)

					end := pgtest.LockRow(t, pool, table, "job")
					acquired := slow.Stat().AcquireCount()
					cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
					lease, err := l.Claim(cctx, "job")
					took := time.Since(deadlineOf(cctx))
					cancel()
					end(true)
					if err == nil {
						require.NoError(t, lease.Unlock(ctx))
						t.Fatal("a claim of a row locked until after its caller gave up succeeded")
					}
					require.ErrorIs(t, err, context.DeadlineExceeded)
					if slow.Stat().AcquireCount() == acquired || pglease.NeverSent(err) {
						requireNoLiveRowOf(t, pool, table, "claimer", 0, "job")
						require.Less(t, attempt, 3, "three claims never reached the server within 100 ms: %v", err)
						t.Logf("attempt %d: the claim never reached the server within its 100 ms (%v): again", attempt, err)
						continue
					}
					require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
						5*time.Second, 10*time.Millisecond, "a claim statement still runs on the server")
					requireNoLiveRowOf(t, pool, table, "claimer", 0, "job")
					assert.Less(t, took, 2*answerGrace, "Claim's return after its context ended")
					var pgErr *pgconn.PgError
					if burst && !errors.As(err, &pgErr) {
						require.Contains(t, err.Error(), "(SQLSTATE 55P03)", "the claim's own lock wait ended it: %v", err)
						require.NotContains(t, err.Error(), "cancelled on the server")
						return
					}
					// Each cancel request costs two of the link's 200 ms delays: the
					// one sent again lands some 800 ms after the deadline.
					require.ErrorAs(t, err, &pgErr, "the repeated cancel request lands on the statement: %v", err)
					require.Equal(t, "57014", pgErr.Code)
					require.Contains(t, err.Error(), "cancelled on the server")
					return
				}
			})
		}
	})

	// Guarantee: on every driver (pgx's pool, database/sql with pgx's
	// stdlib and with lib/pq), a claim whose context ends at any point of
	// its statement's round trips returns within twice answerGrace of that
	// end (Claim's bound), with the context's error, and leaves no statement
	// running and no live row. Through a link with 200 ms of latency each
	// way, while another transaction holds the row's lock, the context ends
	// from 100 ms to 900 ms into the claim: as its statement travels, while
	// its reply does, and while it waits on the row lock. A driver that
	// sends a statement with arguments in two round trips (lib/pq's parse,
	// then its execute) and one cancel request would lose that request to
	// the backend idling between the two, and the claim would then wait as
	// long as the row lock is held.
	t.Run("ReturnsPromptlyOnEveryDriver", func(t *testing.T) {
		t.Parallel()
		for _, driver := range []string{"pgxpool", "pgx", "pq"} {
			t.Run(driver, func(t *testing.T) {
				t.Parallel()
				ctx, pool, table := pgtest.Setup(t)
				p := pgtest.Proxy(t, "")
				app := pgtest.AppName("cancelevery")
				l := pgtest.Locker(t, driverDB(t, pgtest.AppPool(t, "", p, app), driver), table, "claimer")
				for i, ms := range []int{100, 300, 500, 700, 900} {
					after := time.Duration(ms) * time.Millisecond
					key := fmt.Sprintf("job-%d", i)
					freeRow(ctx, t, pool, table, key)
					p.SetLatency(0, 0, 1)
					warm, err := l.Claim(ctx, "warm") // a connection open and idle
					require.NoError(t, err)
					require.NoError(t, warm.Unlock(ctx))
					end := pgtest.LockRow(t, pool, table, key)
					p.SetLatency(200*time.Millisecond, 0, 1)

					cctx, cancel := context.WithTimeout(ctx, after)
					res := make(chan error, 1)
					go func() {
						lease, err := l.Claim(cctx, key)
						if err == nil {
							_ = lease.Unlock(ctx)
							err = errors.New("a claim of a row locked until after its caller gave up succeeded")
						}
						res <- err
					}()
					select {
					case err = <-res:
					case <-time.After(after + 2*answerGrace + 3*time.Second):
						end(true)
						t.Fatalf("Claim had not returned %v after its context ended %v into it", 2*answerGrace+3*time.Second, after)
					}
					took := time.Since(deadlineOf(cctx))
					cancel()
					end(true)
					p.SetLatency(0, 0, 1)
					require.ErrorIs(t, err, context.DeadlineExceeded, "context ended %v into the claim", after)
					assert.Less(t, took, 2*answerGrace, "Claim's return after its context ended %v into it", after)
					require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
						5*time.Second, 10*time.Millisecond, "a claim statement still runs on the server")
					requireNoLiveRowOf(t, pool, table, "claimer", 0, key)
				}
			})
		}
	})

	// Guarantee: Claim returns within twice answerGrace of its context's
	// end even when the cancel request gets no answer (answerGrace for the
	// answer, as long again for the give-back's read), and the row such a
	// claim may commit once the network heals, which no client can undo,
	// is one nobody holds that lapses at its expiry, after which the key is
	// free. The link to the server stalls (bytes held, connections open)
	// while the claim waits on a row lock; its caller gives up; the row
	// lock ends while the link is stalled, and the link then heals.
	t.Run("CancelUnanswered", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		freeRow(ctx, t, pool, table, "job")
		p := pgtest.Proxy(t, "")
		app := pgtest.AppName("cancelstall")
		const ttl = 2 * time.Second
		l := pgtest.Locker(t, pgtest.AppPool(t, "", p, app), table, "claimer", pglease.WithTTL(ttl))

		end := pgtest.LockRow(t, pool, table, "job")
		cctx, cancel := context.WithCancel(ctx)
		type claimed struct {
			lease *pglease.Lease
			err   error
		}
		res := make(chan claimed, 1)
		go func() {
			lease, err := l.Claim(cctx, "job")
			res <- claimed{lease, err}
		}()
		pgtest.LockWaiter(t, pool, app, "pglease.synchronous_commit", 5*time.Second)
		p.SetMode(faultproxy.Stall)
		start := time.Now()
		cancel()
		var r claimed
		select {
		case r = <-res:
		case <-time.After(30 * time.Second):
			t.Fatal("Claim did not return 30s after its context ended")
		}
		took := time.Since(start)
		require.Error(t, r.err)
		require.ErrorIs(t, r.err, context.Canceled)
		end(true)
		require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
			5*time.Second, 10*time.Millisecond, "the claim statement ends once the row lock does")
		p.SetMode(faultproxy.Forward)
		assert.Less(t, took, 2*answerGrace+answerGrace/2, "Claim's return after its context ended")
		requireNoLiveRowOf(t, pool, table, "claimer", ttl+time.Second, "job")
		_, err := pgtest.Locker(t, pool, table, "next").Claim(ctx, "job")
		require.NoError(t, err, "the key is free once the row nobody holds has lapsed")
	})

	// Guarantee: a claim whose caller gives up while it waits on a row lock
	// returns within answerGrace of the context's end (here well within
	// it: the server answers the cancel at once), with an error that is the
	// context's (its deadline, or its cause) and neither ErrHeld nor
	// ErrLost, and leaves no live row and no statement running.
	t.Run("ReturnsPromptlyWithTheCause", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		app := pgtest.AppName("cancelprompt")
		l := pgtest.Locker(t, pgtest.AppPool(t, "", nil, app), table, "claimer")
		why := errors.New("the job was called off")
		for i, deadline := range []bool{true, false} {
			key := fmt.Sprintf("job-%d", i)
			freeRow(ctx, t, pool, table, key)
			end := pgtest.LockRow(t, pool, table, key)
			var cctx context.Context
			var stop func()
			if deadline {
				c, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
				cctx, stop = c, cancel
			} else {
				c, cancel := context.WithCancelCause(ctx)
				tm := time.AfterFunc(200*time.Millisecond, func() { cancel(why) })
				cctx, stop = c, func() { tm.Stop(); cancel(nil) }
			}
			start := time.Now()
			lease, err := l.Claim(cctx, key)
			took := time.Since(start)
			stop()
			end(true)
			require.Nil(t, lease)
			require.Error(t, err)
			if deadline {
				require.ErrorIs(t, err, context.DeadlineExceeded)
			} else {
				require.ErrorIs(t, err, why)
			}
			require.NotErrorIs(t, err, pglease.ErrHeld)
			require.NotErrorIs(t, err, pglease.ErrLost)
			require.Less(t, took, 200*time.Millisecond+answerGrace/2, "the server answered the cancel at once")
			require.Equal(t, 0, claimsRunning(ctx, t, pool, app))
			requireNoLiveRowOf(t, pool, table, "claimer", 0, key)
		}
	})

	// Guarantee: a cancel request must never cancel a different statement
	// than the claim it was sent for, also through PgBouncer. In
	// transaction pooling with one server connection, a claim waits on a
	// row lock that ends as its caller gives up: the claim commits, the
	// server connection goes to a bystander's statement, and PgBouncer
	// (which opens a new server connection to forward the cancel request
	// it got while the claim still ran) delivers it to that backend, where
	// the bystander's statement now runs.
	t.Run("NoOtherStatementThroughPgBouncer", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 1})
		bounced := func(conns int32) *pgxpool.Pool {
			return pgtest.PoolWith(t, b.DSN(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
				cfg.MaxConns = conns
			})
		}
		l := pgtest.Locker(t, bounced(4), table, "claimer")
		stopBystander := bystander(ctx, bounced(1), "SELECT pg_sleep(0.02)")
		const rounds = 40
		var gaveUp int
		for i := range rounds {
			key := fmt.Sprintf("job-%d", i)
			freeRow(ctx, t, pool, table, key)
			end := pgtest.LockRow(t, pool, table, key)
			cctx, cancel := context.WithTimeout(ctx, 150*time.Millisecond)
			// The lock ends from 2 ms before to 2 ms after the caller
			// gives up.
			offset := time.Duration(i%9-4) * 500 * time.Microsecond
			tm := time.AfterFunc(150*time.Millisecond+offset, func() { end(true) })
			lease, err := l.Claim(cctx, key)
			cancel()
			tm.Stop()
			end(true)
			if err != nil {
				gaveUp++
			}
			if err == nil {
				require.NoError(t, lease.Unlock(ctx))
			}
		}
		ran, cancelled := stopBystander()
		require.Positive(t, ran)
		assert.Zero(t, cancelled, "statements of another client cancelled by the cancel requests of claims (of %d run)", ran)
		t.Logf("%d of %d claims gave up", gaveUp, rounds)
		for i := range rounds {
			requireNoLiveRowOf(t, pool, table, "claimer", 2*time.Second, fmt.Sprintf("job-%d", i))
		}
	})

	// Guarantee: a claim that returns an error leaves no live row that
	// nobody holds, also on a Locker over one *pgx.Conn, whose claim is
	// cancelled on the server and answered as on a pool connection (closing
	// the socket would leave the statement to take the row once the lock
	// ends, and the give-back's read would go to that closed connection).
	// A claim waits on a row lock that ends as its caller gives up.
	t.Run("GivenUpOnASingleConnection", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		app := pgtest.AppName("cancelconn")
		givenUpAsRowLocksEnd(ctx, t, pool, table, app, func(int) *pglease.Locker {
			cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
			require.NoError(t, err)
			cfg.RuntimeParams["application_name"] = app
			conn, err := pgx.ConnectConfig(ctx, cfg)
			require.NoError(t, err)
			t.Cleanup(func() { _ = conn.Close(context.Background()) })
			return pgtest.Locker(t, conn, table, "claimer")
		})
	})

	// Guarantee: a Locker on one *pgx.Conn whose claim was given up and did
	// not end within answerGrace of its cancel request, though the server
	// answered the request (the statement's reply is held on its way back),
	// no longer uses that connection, and its later statements say why
	// instead of pgx's bare "conn closed".
	t.Run("GivenConnectionCutAtTheGraceSaysWhy", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		freeRow(ctx, t, pool, table, "job")
		p := pgtest.Proxy(t, "")
		app := pgtest.AppName("cancelheld")
		l := pgtest.Locker(t, cancelsAround(ctx, t, p, app), table, "claimer")

		end := pgtest.LockRow(t, pool, table, "job")
		t.Cleanup(func() { end(false) })
		cctx, cancel := context.WithCancel(ctx)
		res := make(chan error, 1)
		go func() {
			lease, err := l.Claim(cctx, "job")
			if err == nil {
				err = fmt.Errorf("a claim given up on a locked row returned lease %d", lease.Fence())
			}
			res <- err
		}()
		pgtest.LockWaiter(t, pool, app, "pglease.synchronous_commit", 5*time.Second)
		p.SetMode(faultproxy.Stall) // the reply to the cancelled statement is held
		cancel()
		err := <-res
		require.ErrorIs(t, err, context.Canceled)
		require.Contains(t, err.Error(), "did not end within 1s of the cancel request")
		p.SetMode(faultproxy.Forward)

		_, err = l.Claim(ctx, "next")
		require.Error(t, err, "a claim on the connection closed after the grace")
		require.Contains(t, err.Error(), "the connection the Locker was given is closed", "the error says why: %v", err)
		requireNoLiveRowOf(t, pool, table, "claimer", 0, "job")
	})

	// Guarantee: many claims given up at every phase at once (before a
	// connection is had, in flight, as the reply comes back), on a Locker
	// with a kept connection whose heartbeat extends a lease meanwhile and
	// whose pool also serves the application's statements: no cancel
	// request reaches the heartbeat or the application's statements, every
	// claim that failed left no live row, every one that succeeded holds its
	// row, and the error says why.
	for _, bounced := range []bool{false, true} {
		t.Run(fmt.Sprintf("ManyAtOnce/pgbouncer=%v", bounced), func(t *testing.T) {
			t.Parallel()
			manyAtOnce(t, bounced)
		})
	}

	// Guarantee: ClaimWait whose context ends while its claim waits on a
	// row lock, the lock ending at that moment, returns promptly with the
	// context's error (or the lease, never left behind), and leaves no
	// live row; so does one waiting behind a live lease of another holder,
	// whose error also wraps ErrHeld.
	t.Run("ClaimWaitGivenUpAsARowLockEnds", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		app := pgtest.AppName("cancelwait")
		l := pgtest.Locker(t, pgtest.AppPool(t, "", nil, app), table, "claimer")
		for i := range 10 {
			key := fmt.Sprintf("job-%d", i)
			freeRow(ctx, t, pool, table, key)
			end := pgtest.LockRow(t, pool, table, key)
			cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
			stop := context.AfterFunc(cctx, func() { end(true) })
			start := time.Now()
			lease, err := l.ClaimWait(cctx, key)
			took := time.Since(start)
			cancel()
			stop()
			end(true)
			assert.Less(t, took, 100*time.Millisecond+answerGrace, "ClaimWait's return after its context ended")
			if err == nil {
				require.NoError(t, lease.Unlock(ctx))
				continue
			}
			require.ErrorIs(t, err, context.DeadlineExceeded)
			require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
				5*time.Second, 10*time.Millisecond, "a claim statement still runs on the server")
			requireNoLiveRowOf(t, pool, table, "claimer", 0, key)
		}

		other := pgtest.Locker(t, pool, table, "other")
		held, err := other.Claim(ctx, "held")
		require.NoError(t, err)
		for attempt := 1; ; attempt++ {
			cctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
			start := time.Now()
			_, err = l.ClaimWait(cctx, "held")
			took := time.Since(start)
			cancel()
			require.ErrorIs(t, err, context.DeadlineExceeded)
			if pglease.NeverSent(err) {
				// Its 300 ms ran out before a new connection opened: it
				// never asked, so it cannot know the key is held.
				require.Less(t, attempt, 3, "three claims never reached the server within 300 ms: %v", err)
				t.Logf("attempt %d: the claim never reached the server (%v): again", attempt, err)
				continue
			}
			require.ErrorIs(t, err, pglease.ErrHeld)
			assert.Less(t, took, 300*time.Millisecond+answerGrace/2)
			break
		}
		require.NoError(t, held.Unlock(ctx))
	})

	// Guarantee: a re-entrant claim (same holder, its own lease live)
	// cancelled on the server while it waits on the row lock wrote nothing,
	// so the lease it would have replaced goes on: not lost, its row
	// unchanged, still extended.
	t.Run("ReentrantClaimCancelledKeepsTheLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = 2 * time.Second
		l := pgtest.Locker(t, pool, table, "claimer", pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100*time.Millisecond))
		for attempt := 1; ; attempt++ {
			key := fmt.Sprintf("job-%d", attempt)
			lease, err := l.Claim(ctx, key)
			require.NoError(t, err)
			end := pgtest.LockRow(t, pool, table, key)
			cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
			_, err = l.Claim(cctx, key)
			cancel()
			end(true)
			require.ErrorIs(t, err, context.DeadlineExceeded)
			if pglease.NeverSent(err) {
				// Its 200 ms ran out before it had a connection (a new one,
				// dialed on a busy machine): there was nothing to cancel.
				require.Less(t, attempt, 3, "three claims never reached the server within 200 ms: %v", err)
				t.Logf("attempt %d: the claim never reached the server (%v): again", attempt, err)
				require.NoError(t, lease.Unlock(ctx))
				continue
			}
			var pgErr *pgconn.PgError
			require.True(t, errors.As(err, &pgErr) && pgErr.Code == "57014", "cancelled on the server: %v", err)
			select {
			case <-lease.Done():
				t.Fatalf("the lease ended though the claim that would replace it wrote nothing: %v", lease.Err())
			case <-time.After(ttl):
			}
			row, ok := pgtest.ReadRow(t, pool, table, key)
			require.True(t, ok)
			require.Equal(t, lease.Fence(), row.Fence)
			require.NoError(t, lease.Unlock(ctx))
			return
		}
	})

	// Guarantee: with WithKeptConnection, a claim cancelled on the server
	// as the Locker's first claim does not leave its closed connection as
	// the kept reserve: the next lease's heartbeat runs and keeps it across
	// several TTLs.
	t.Run("KeptConnectionAfterACancel", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		const ttl = time.Second
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "claimer", pglease.WithKeptConnection(), pglease.WithTTL(ttl),
			pglease.WithHeartbeatInterval(200*time.Millisecond), pglease.WithHook(events.Hook))
		freeRow(ctx, t, pool, table, "locked")
		end := pgtest.LockRow(t, pool, table, "locked")
		cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
		_, err := l.Claim(cctx, "locked")
		cancel()
		end(true)
		require.ErrorIs(t, err, context.DeadlineExceeded)

		lease, err := l.Claim(ctx, "free")
		require.NoError(t, err)
		select {
		case <-lease.Done():
			t.Fatalf("lease lost after a cancelled claim: %v", lease.Err())
		case <-time.After(3 * ttl):
		}
		require.NoError(t, lease.Err())
		assert.GreaterOrEqual(t, events.Count(pglease.EventExtended), 5, "heartbeat rounds in 3 TTLs")
		require.NoError(t, lease.Unlock(ctx))
		requireNoLiveRowOf(t, pool, table, "claimer", 0, "locked")
	})

	// Guarantee: Close while claims wait on row locks ends them promptly
	// (their statements cancelled on the server and answered), each with
	// ErrClosed, and leaves no live row once the locks end; goleak in
	// TestMain checks that no goroutine outlives it.
	for _, burst := range []bool{false, true} {
		t.Run(fmt.Sprintf("CloseWhileClaimsWait/burst=%v", burst), func(t *testing.T) {
			t.Parallel()
			closeWhileClaimsWait(t, burst)
		})
	}

	// Guarantee: a cancel request that lands late never cuts a later
	// statement's commit: on the one connection a Locker was given, a claim
	// whose cancel request the server did not answer within answerGrace
	// leaves the connection closed, and no lease is handed out after it
	// whose commit's wait for a synchronous standby that request could cut.
	t.Run("LateCancelRequestNeverReachesALaterClaim", testLateCancelRequest)

	// Guarantee: a claim given up while its pool pings the idle connection
	// it is about to hand over leaves no cancel request on its way to that
	// connection's next statement (a claim among them): pgxpool gives the
	// connection back once the ping returns, so the ping must not be
	// cancelled at the claim's deadline (driver.NoDeadline).
	t.Run("PoolsPingGivenUpNeverReachesALaterStatement/pgxpool", func(t *testing.T) { testPoolsPingGivenUp(t, pgxpoolPinged) })
	t.Run("PoolsPingGivenUpNeverReachesALaterStatement/stdlib", func(t *testing.T) { testPoolsPingGivenUp(t, stdlibPinged) })
}

// pingedPool is a pool of conns connections whose statements are
// cancelled by cancel request, dialled through late, as a Locker takes it,
// and a way to run one statement on each of its connections at once.
type pingedPool struct {
	db     pglease.DB
	onEach func(ctx context.Context, sql string, args ...any) []error
}

func pgxpoolPinged(t *testing.T, dsn string, late *pgtest.LateCancel) pingedPool {
	t.Helper()
	const conns = 2
	pool := pgtest.CancelRequestPool(t, dsn, func(cfg *pgxpool.Config) {
		cfg.MaxConns = conns
		cfg.ConnConfig.DialFunc = late.Dial(cfg.ConnConfig.DialFunc)
	})
	return pingedPool{db: pool, onEach: func(ctx context.Context, sql string, args ...any) []error {
		return onEachConn(conns, func() error {
			c, err := pool.Acquire(ctx)
			if err != nil {
				return err
			}
			defer c.Release()
			_, err = c.Exec(context.WithoutCancel(ctx), sql, args...)
			return err
		})
	}}
}

func stdlibPinged(t *testing.T, dsn string, late *pgtest.LateCancel) pingedPool {
	t.Helper()
	const conns = 2
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	cfg.DialFunc = late.Dial(cfg.DialFunc)
	cfg.BuildContextWatcherHandler = func(pc *pgconn.PgConn) ctxwatch.Handler {
		return &pgconn.CancelRequestContextWatcherHandler{Conn: pc, DeadlineDelay: 5 * time.Second}
	}
	db := stdlib.OpenDB(*cfg)
	db.SetMaxOpenConns(conns)
	t.Cleanup(func() { _ = db.Close() })
	return pingedPool{db: pglease.SQL(db), onEach: func(ctx context.Context, sql string, args ...any) []error {
		return onEachConn(conns, func() error {
			c, err := db.Conn(ctx)
			if err != nil {
				return err
			}
			defer c.Close()
			_, err = c.ExecContext(context.WithoutCancel(ctx), sql, args...)
			return err
		})
	}}
}

// onEachConn runs f on n goroutines at once and returns their errors.
func onEachConn(n int, f func() error) []error {
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Go(func() { errs[i] = f() })
	}
	wg.Wait()
	return errs
}

func testPoolsPingGivenUp(t *testing.T, pinged func(*testing.T, string, *pgtest.LateCancel) pingedPool) {
	t.Helper()
	t.Parallel()
	ctx, direct, table := pgtest.Setup(t)
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond) // past pgx's wait for its answer
	p := pinged(t, direct.Config().ConnString(), late)
	l := pgtest.Locker(t, p.db, table, "holder", pglease.WithTTL(time.Minute))
	pglease.SetCoalesceAll(l, false)
	warm, err := l.Claim(ctx, "warm")
	require.NoError(t, err)
	require.NoError(t, warm.Unlock(ctx))

	// The pool pings a connection idle for over a second before it hands
	// it over; its reply comes 600 ms late, past the claim's 200 ms.
	time.Sleep(1100 * time.Millisecond)
	late.DelayNextReply(600 * time.Millisecond)
	cctx, cancel := context.WithTimeout(ctx, 200*time.Millisecond)
	_, err = l.Claim(cctx, "given-up")
	cancel()
	require.ErrorIs(t, err, context.DeadlineExceeded)
	gaveUp := time.Now()

	// Once the ping returned and the pool has the connection back, a
	// statement on each of its connections runs past the time a cancel
	// request sent at the claim's deadline would land there.
	time.Sleep(700 * time.Millisecond)
	for _, err := range p.onEach(ctx, "SELECT pg_sleep($1)", time.Until(gaveUp.Add(3500*time.Millisecond)).Seconds()) {
		require.NoError(t, err, "a statement whose context never ended was cancelled by a late cancel request of the pool's ping (%d sent)", late.Sent())
	}
	got, err := l.Claim(ctx, "after")
	require.NoError(t, err)
	require.NoError(t, got.Unlock(ctx))
}

// manyAtOnce is TestClaimCancel/ManyAtOnce, on a pool to the server or
// through PgBouncer in transaction pooling (two server connections).
func manyAtOnce(t *testing.T, bounced bool) {
	t.Helper()
	ctx, pool, table := pgtest.Setup(t)
	app := pgtest.AppName("cancelmany")
	var lp *pgxpool.Pool
	if bounced {
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 2})
		lp = pgtest.PoolWith(t, b.DSN(), func(cfg *pgxpool.Config) {
			cfg.ConnConfig.DefaultQueryExecMode = pgx.QueryExecModeExec
			cfg.MaxConns = 4
		})
	} else {
		lp = pgtest.AppPool(t, "", nil, app)
	}
	events := pgtest.NewEvents(t)
	const ttl = 2 * time.Second
	l := pgtest.Locker(t, lp, table, "claimer", pglease.WithKeptConnection(), pglease.WithTTL(ttl),
		pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
	other := pgtest.Locker(t, pool, table, "other")
	kept, err := l.Claim(ctx, "kept")
	require.NoError(t, err)
	for i := range 3 {
		_, err := other.Claim(ctx, fmt.Sprintf("held-%d", i))
		require.NoError(t, err)
	}
	stopBystander := bystander(ctx, lp, "SELECT pg_sleep(0.002)")

	var mu sync.Mutex
	var failed []string
	var leases []*pglease.Lease
	var claims sync.WaitGroup
	for g := range 8 {
		claims.Add(1)
		go func() {
			defer claims.Done()
			for i := range 60 {
				key := fmt.Sprintf("free-%d-%d", g, i)
				if i%4 == 3 {
					key = fmt.Sprintf("held-%d", i%3)
				}
				cctx, cancel := context.WithTimeout(ctx, time.Duration((g*60+i)%12)*time.Millisecond)
				lease, err := l.Claim(cctx, key)
				cancel()
				mu.Lock()
				if err == nil {
					leases = append(leases, lease)
				} else {
					if !errors.Is(err, pglease.ErrHeld) && !errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("claim of %q: neither held nor given up: %v", key, err)
					}
					if errors.Is(err, pglease.ErrHeld) && errors.Is(err, context.DeadlineExceeded) {
						t.Errorf("claim of %q: both held and given up: %v", key, err)
					}
					failed = append(failed, key)
				}
				mu.Unlock()
			}
		}()
	}
	claims.Wait()
	ran, cancelled := stopBystander()
	t.Logf("%d claims succeeded, %d failed; %d bystander statements", len(leases), len(failed), ran)
	require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == 0 },
		5*time.Second, 10*time.Millisecond, "claim statements still run on the server")
	if bounced {
		time.Sleep(time.Second) // the claims' backends are PgBouncer's, not named app
	}
	assert.Zero(t, cancelled, "the application's statements cancelled by cancel requests of claims")
	require.NoError(t, kept.Err(), "the lease extended while claims were cancelled")
	for _, lease := range leases {
		row, ok := pgtest.ReadRow(t, pool, table, lease.Key())
		require.True(t, ok)
		require.True(t, row.Live && row.Holder == l.Holder() && row.Fence == lease.Fence(), "the row of a lease handed out: %+v", row)
		require.NoError(t, lease.Unlock(ctx))
	}
	// A claim whose caller gave up while its statement was in flight
	// returned at once; what that statement wrote is given back once it
	// returns, which Close waits for. Such a row was released (expired in
	// place before its TTL ran out), never left to lapse.
	require.NoError(t, kept.Unlock(ctx))
	require.NoError(t, l.Close(ctx))
	for _, key := range failed {
		row, ok := pgtest.ReadRow(t, pool, table, key)
		if !ok || row.Holder != l.Holder() {
			continue
		}
		if row.Live || !row.ExpiresAt.Before(row.AcquiredAt.Add(ttl)) {
			t.Errorf("row of %q not given back after its claim failed and its Locker closed: %+v", key, row)
		}
	}
}

// closeWhileClaimsWait is TestClaimCancel/CloseWhileClaimsWait, each claim
// sent alone or through the burst statement.
func closeWhileClaimsWait(t *testing.T, burst bool) {
	t.Helper()
	ctx, pool, table := pgtest.Setup(t)
	app := pgtest.AppName("cancelclose")
	l := pglease.NewLocker(pgtest.AppPool(t, "", nil, app), pglease.WithTable(table), pglease.WithHolder("claimer"),
		pglease.WithLogger(pgtest.Quiet))
	t.Cleanup(func() { _ = l.Close(context.Background()) })
	pglease.SetCoalesceAll(l, burst)
	keys := []string{"k0", "k1", "k2"} // a pool of 4: claims hold at most 3
	var ends []func(bool)
	for _, key := range keys {
		freeRow(ctx, t, pool, table, key)
		ends = append(ends, pgtest.LockRow(t, pool, table, key))
	}
	errs := make(chan error, len(keys))
	for _, key := range keys {
		go func() {
			_, err := l.Claim(ctx, key)
			errs <- err
		}()
	}
	require.Eventually(t, func() bool { return claimsRunning(ctx, t, pool, app) == len(keys) },
		5*time.Second, 10*time.Millisecond, "every claim waiting on its row lock")
	start := time.Now()
	require.NoError(t, l.Close(ctx))
	took := time.Since(start)
	for range keys {
		err := <-errs
		require.ErrorIs(t, err, pglease.ErrClosed)
	}
	for _, end := range ends {
		end(true)
	}
	assert.Less(t, took, answerGrace, "Close with claims being cancelled")
	require.Equal(t, 0, claimsRunning(ctx, t, pool, app))
	requireNoLiveRowOf(t, pool, table, "claimer", 0, keys...)
}

// driverDB is pool as a Locker takes it through driver: "pgxpool" for
// the pool itself, "pgx" or "pq" for a database/sql pool of pgx's stdlib
// or lib/pq on its server, settings and size.
func driverDB(t *testing.T, pool *pgxpool.Pool, driver string) pglease.DB {
	t.Helper()
	if driver == "pgxpool" {
		return pool
	}
	return pglease.SQL(pgtest.OpenSQL(t, pool, driver))
}

// deadlineOf is ctx's deadline.
func deadlineOf(ctx context.Context) time.Time {
	d, _ := ctx.Deadline()
	return d
}

func testLateCancelRequest(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	tbl := pgx.Identifier{table}.Sanitize()
	_, err := pool.Exec(ctx, `INSERT INTO `+tbl+` (key, holder, acquired_at, expires_at)
		SELECT 'held-' || n, 'gone', now() - interval '2 min', now() - interval '1 min' FROM generate_series(1, 3) n`)
	require.NoError(t, err)
	pgtest.AbsentStandby(ctx, t, srv.DSN())

	// Cancel requests land 2.5 s after they are sent: past answerGrace.
	cfg, late := pgtest.LateCancelConfig(t, pool.Config().ConnConfig.ConnString(), 2500*time.Millisecond)
	warned := pgtest.CountCutWaits(&cfg.Config)
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	l := pgtest.Locker(t, conn, table, "claimer", pglease.WithTTL(30*time.Second))

	// Another transaction locks an expired row. The claim waits on it
	// and is given up there; once its cancel request is sent (it lands
	// 2.5 s later), the transaction makes the row held and commits
	// (locally): the claim loses, writing nothing, before its cancel
	// request lands.
	for attempt := 1; ; attempt++ {
		key := fmt.Sprintf("held-%d", attempt) // an expired row
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		t.Cleanup(func() { _ = tx.Rollback(context.Background()) }) // before the pool's Close, which waits for it
		_, err = tx.Exec(ctx, `SET LOCAL synchronous_commit = local`)
		require.NoError(t, err)
		_, err = tx.Exec(ctx, `SELECT 1 FROM `+tbl+` WHERE key = $1 FOR UPDATE`, key)
		require.NoError(t, err)
		cctx, cancel := context.WithCancel(ctx)
		claimed := make(chan error, 1)
		go func() {
			_, err := l.Claim(cctx, key)
			claimed <- err
		}()
		require.Eventually(t, func() bool {
			var waiting int
			require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity
				WHERE wait_event_type = 'Lock' AND strpos(query, $1) > 0`, table).Scan(&waiting))
			return waiting == 1
		}, 10*time.Second, 10*time.Millisecond, "the claim waits on the row lock")
		cancel()
		var early error
		require.Eventually(t, func() bool {
			select {
			case early = <-claimed:
			default:
			}
			return late.Sent() > 0 || early != nil
		}, 10*time.Second, 5*time.Millisecond, "the claim given up sends its cancel request or returns")
		if late.Sent() == 0 {
			// Its statement had ended its lock wait, to be sent again after
			// a pause, when it was given up: nothing to cancel.
			require.NoError(t, tx.Rollback(ctx))
			require.Less(t, attempt, 3, "three claims given up between their statements: %v", early)
			t.Logf("attempt %d: the claim was given up between its statements (%v): again", attempt, early)
			continue
		}
		_, err = tx.Exec(ctx, `UPDATE `+tbl+` SET holder = 'other', expires_at = now() + interval '1 min' WHERE key = $1`, key)
		require.NoError(t, err)
		require.NoError(t, tx.Commit(ctx))
		if early == nil {
			early = <-claimed
		}
		require.Error(t, early)
		require.Zero(t, late.Landed(), "the first cancel request landed before the second claim: the case is not the one described")
		break
	}

	// A claim of a free key: its commit waits for the absent standby, and
	// the late request would cut that wait.
	cctx, cancel := context.WithTimeout(ctx, 6*time.Second)
	defer cancel()
	lease, err := l.Claim(cctx, "free")
	require.Error(t, err, "a lease was handed out whose commit's wait a late cancel request cut (%d WARNINGs)", warned.Load())
	require.Nil(t, lease)
	require.ErrorContains(t, err, "the connection the Locker was given is closed", "the error names why and what to do")
	require.Eventually(t, func() bool { return late.Landed() > 0 }, 10*time.Second, 50*time.Millisecond,
		"the late cancel request was delivered: the case is the one described")
	requireNoLiveRowOf(t, pool, table, "claimer", 5*time.Second, "free")
}

// cancelsAround is a *pgx.Conn of application app whose own connection goes
// through p, while pgx's cancel requests (each on a connection of its own)
// go to the server directly: a stalled p holds the statement's reply, and
// the cancel requests are answered all the same.
func cancelsAround(ctx context.Context, t *testing.T, p *faultproxy.Proxy, app string) *pgx.Conn {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	cfg.RuntimeParams["application_name"] = app
	server := net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port)))
	var dialed atomic.Bool
	var d net.Dialer
	cfg.DialFunc = func(ctx context.Context, network, _ string) (net.Conn, error) {
		if dialed.CompareAndSwap(false, true) {
			return d.DialContext(ctx, network, p.Addr())
		}
		return d.DialContext(ctx, network, server)
	}
	conn, err := pgx.ConnectConfig(ctx, cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	return conn
}

// TestClaimCancelOnAPoolConnection: a Locker given one *pgxpool.Conn (a
// connection acquired from a pool whose pgx cancels by cancel request)
// whose claim is given up in flight, its cancel request unanswered, closes
// that connection as it does a *pgx.Conn: otherwise the late request lands
// on its next claim there, whose commit's wait for a synchronous standby it
// cuts, and that claim is reported done.
func TestClaimCancelOnAPoolConnection(t *testing.T) {
	t.Parallel()
	ctx, srv, pool, table := pgtest.PrivateSetup(t)
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond)
	cpool, _ := late.Pool(t, pool.Config().ConnString(), 2)
	pc, err := cpool.Acquire(ctx)
	require.NoError(t, err)
	t.Cleanup(pc.Release)
	l := pgtest.Locker(t, pc, table, "holder", pglease.WithTTL(time.Minute))
	warm, err := l.Claim(ctx, "warm") // the table check is done, the statement prepared
	require.NoError(t, err)
	require.NoError(t, warm.Unlock(ctx))

	late.DelayNextReply(600 * time.Millisecond)
	gctx, cancel := context.WithTimeout(ctx, 250*time.Millisecond)
	_, err = l.Claim(gctx, "given-up")
	cancel()
	t.Logf("given-up claim: %v (closed: %v)", err, pc.Conn().IsClosed())
	require.Positive(t, late.Sent(), "pgx sent a cancel request for the claim: the case is the one described")
	pgtest.AbsentStandby(ctx, t, srv.DSN())
	require.Zero(t, late.Landed(), "the case: the cancel request has not landed yet")

	got, err := claimUntilLanded(ctx, t, l, late, "free")
	require.Eventually(t, func() bool { return late.Landed() > 0 }, 10*time.Second, 50*time.Millisecond,
		"the late cancel request was delivered: the case is the one described")
	require.Error(t, err, "a lease was handed out whose commit's wait for the standby a late cancel request cut")
	require.Nil(t, got)
}

// TestClaimCancelNothingOutlivesCloseAfterAnUnansweredCancel: no goroutine
// outlives Locker.Close, also after a claim whose cancel request got no
// answer: the link to the server stalls
// while the claim waits on a row lock, its caller gives up, and the
// Locker is closed once Claim returned. The claim's connection, closed
// by pgx as answerGrace ends its statement's context, still sends a
// cancel request of its own (for up to 15 s) from a goroutine of its
// own after Close returned. Close waits for that clean-up: a Close
// still waiting for it closeHold after it began (past every bound of
// the Locker's own) sees the link heal, and the clean-up end as its
// cancel request is answered, rather than wait out pgx's 15 s; a Close
// that returned sooner is checked with the link still stalled.
//
// It runs alone, not in parallel: goleak sees the goroutines of every
// test running beside it, the connections other tests close among them.
func TestClaimCancelNothingOutlivesCloseAfterAnUnansweredCancel(t *testing.T) {
	before := goleak.IgnoreCurrent()
	ctx, pool, table := pgtest.Setup(t)
	freeRow(ctx, t, pool, table, "job")
	p := pgtest.Proxy(t, "")
	app := pgtest.AppName("cancelleak")
	l := pglease.NewLocker(pgtest.AppPool(t, "", p, app), pglease.WithTable(table), pglease.WithHolder("claimer"),
		pglease.WithLogger(pgtest.Quiet), pglease.WithTimeout(500*time.Millisecond))
	end := pgtest.LockRow(t, pool, table, "job")
	t.Cleanup(func() { end(false); p.SetMode(faultproxy.Forward) })

	cctx, cancel := context.WithCancel(ctx)
	res := make(chan error, 1)
	go func() {
		_, err := l.Claim(cctx, "job")
		res <- err
	}()
	pgtest.LockWaiter(t, pool, app, "pglease.synchronous_commit", 5*time.Second)
	p.SetMode(faultproxy.Stall)
	cancel()
	require.ErrorIs(t, <-res, context.Canceled)
	const closeHold = 3 * answerGrace
	closed := make(chan error, 1)
	go func() { closed <- l.Close(ctx) }()
	var closeErr error
	select {
	case closeErr = <-closed:
	case <-time.After(closeHold):
		require.Contains(t, goroutineStacks(), "asyncClose",
			"Close still waits, the claim's connection's clean-up no longer runs: the case is not the one described")
		p.SetMode(faultproxy.Forward)
		closeErr = <-closed
	}
	require.NoError(t, closeErr)
	err := goleak.Find(before)
	if err != nil && strings.Contains(err.Error(), "asyncClose") {
		t.Fatalf("a goroutine of the claim's connection outlives Close: %v", err)
	}
}
