package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgbouncer"
	"github.com/pglease/pglease/internal/pgserver"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// pollBound is how soon a polling waiter sees a release once its backoff
// has grown: MaxPollInterval plus its jitter (a quarter), plus a claim's
// round trip on a loaded machine.
const pollBound = pglease.MaxPollInterval*5/4 + 500*time.Millisecond

// notifyBound is how soon a waiter woken by notification gets a released
// key: far below the safety net of 2.5s or more.
const notifyBound = 2 * time.Second

// TestListen attacks WithListenDSN and the polling schedule: waiters that
// miss a release, WaitMode that says one thing while another holds,
// Close while the listening connection is dialed, bad DSNs, and the
// number of statements a polling waiter sends.
func TestListen(t *testing.T) {
	t.Parallel()

	// BlackholedConnectionIsNoticed: a listening connection whose packets
	// are silently dropped (a partition, a dead NAT entry) delivers no
	// release; the Locker must notice and poll, so that a release is seen
	// within the polling bound, not only at the 2.5-5s safety net.
	t.Run("BlackholedConnectionIsNoticed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		p := pgtest.Proxy(t, "")
		stmts := &pgtest.Statements{}
		wpool := pgtest.Pool(t, stmts)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, wpool, table, "waiter", pglease.WithListenDSN(proxyDSN(t, p)))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)

		p.SetMode(faultproxy.Blackhole)
		// Release just after the waiter's next safety-net attempt, so that
		// only noticing the dead connection can wake it in time.
		n := stmts.Count("claim")
		require.Eventually(t, func() bool { return stmts.Count("claim") > n }, 10*time.Second, time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		released := time.Now()
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 10*time.Second)
		require.NoError(t, r.err)
		took := time.Since(released)
		mode, reason := waiter.WaitMode()
		require.LessOrEqual(t, took, pollBound,
			"released key taken %v after the release through a dead listening connection; WaitMode: %v %q", took, mode, reason)
	})

	// LateProbeIsTriedAgain: a probe that came back late once (the
	// listening connection stalled for a moment) leaves the Locker polling;
	// once the connection delivers again it must go back to notification,
	// as it does after any other failure of the listening connection.
	t.Run("LateProbeIsTriedAgain", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		p := pgtest.Proxy(t, "")
		db := &probeGate{DB: pool, entered: make(chan struct{}), gate: make(chan struct{})}
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, db, table, "waiter", pglease.WithListenDSN(proxyDSN(t, p)))
		held, got := holdAndWait(ctx, t, holder, waiter)
		select {
		case <-db.entered: // LISTEN done; the first probe is about to be sent
		case <-time.After(10 * time.Second):
			t.Fatal("no probe sent")
		}
		p.SetMode(faultproxy.Stall)
		close(db.gate)
		require.Eventually(t, func() bool {
			m, reason := waiter.WaitMode()
			return m == pglease.WaitByPolling && strings.Contains(reason, "did not arrive")
		}, 10*time.Second, 5*time.Millisecond, "the stalled probe is reported")
		p.SetMode(faultproxy.Forward)

		ok := waitForModeWithin(waiter, pglease.WaitByNotification, 10*time.Second)
		mode, reason := waiter.WaitMode()
		require.True(t, ok, "10s after the listening connection delivers again, WaitMode: %v %q", mode, reason)
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, notifyBound).err)
	})

	// KilledBackendMissesNoRelease: a release made while the listening
	// backend is being killed notifies nobody; the listener dials again and
	// every waiter tries once, so the key is taken at once, on a new
	// backend, by notification.
	t.Run("KilledBackendMissesNoRelease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(pgtest.Server.DSN()))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		pid := pglease.ListenerPID(waiter)
		_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, int32(pid))
		require.NoError(t, err)
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, notifyBound)
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Unlock(ctx))
		require.Eventually(t, func() bool {
			m, _ := waiter.WaitMode()
			return m == pglease.WaitByNotification && pglease.ListenerPID(waiter) != pid && pglease.ListenerPID(waiter) != 0
		}, 10*time.Second, 5*time.Millisecond, "listening again on a new backend")
	})

	// OtherDatabaseIsNotTrusted: a DSN to the right server but another
	// database hears none of the releases (NOTIFY is per database): the
	// probe says so, the Locker polls, and the waiter still gets the key
	// within the polling bound.
	t.Run("OtherDatabaseIsNotTrusted", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		other := "template1"
		if cfg.Database == other {
			other = "postgres"
		}
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(dsnWith(cfg, cfg.Host, cfg.Port, cfg.User, cfg.Password, other, "")))
		held, got := holdAndWait(ctx, t, holder, waiter)
		require.Eventually(t, func() bool {
			m, reason := waiter.WaitMode()
			return m == pglease.WaitByPolling && strings.Contains(reason, "did not arrive")
		}, 10*time.Second, 5*time.Millisecond)
		released := time.Now()
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, 5*time.Second).err)
		require.LessOrEqual(t, time.Since(released), pollBound)
		m, _ := waiter.WaitMode()
		require.Equal(t, pglease.WaitByPolling, m, "never claims notification")
	})

	// OddTableAndSearchPathWakeByNotification: a table in a schema, both
	// names needing quotes, and a listening connection with another
	// search_path than the DB's: the channel is the table's name as given,
	// so the release still wakes the waiter by notification.
	t.Run("OddTableAndSearchPathWakeByNotification", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		schema := pgtest.Name("Odd$Schema")
		name := schema + `.Lease$Tab`
		_, err := pool.Exec(ctx, `CREATE SCHEMA `+pgx.Identifier{schema}.Sanitize())
		require.NoError(t, err)
		require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(name)))
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		dsn := dsnWith(cfg, cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database, "-c search_path=pg_catalog")
		holder := pgtest.Locker(t, pool, name, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, name, "waiter", pglease.WithListenDSN(dsn))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, notifyBound)
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Unlock(ctx))
	})

	// BadCredentialsPollAndLeakNothing: a DSN that parses but names a role
	// that cannot log in: the Locker polls, says why without repeating the
	// password, writes nothing, hands the key over within the polling
	// bound, and Close leaves no goroutine (goleak in TestMain).
	t.Run("BadCredentialsPollAndLeakNothing", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		dsn := dsnWith(cfg, cfg.Host, cfg.Port, "pglease_no_such_role", "hunter2secret", cfg.Database, "")
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook), pglease.WithListenDSN(dsn))
		held, got := holdAndWait(ctx, t, holder, waiter)
		ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		for !errorContains(ev.Err, "dialing") {
			ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		}
		_, reason := waiter.WaitMode()
		require.NotContains(t, ev.Err.Error(), "hunter2secret")
		require.NotContains(t, reason, "hunter2secret")
		require.Contains(t, reason, "pglease_no_such_role", "says which role failed")
		time.Sleep(2 * time.Second) // backoff grown
		released := time.Now()
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 5*time.Second)
		require.NoError(t, r.err)
		require.LessOrEqual(t, time.Since(released), pollBound)
		var rows int
		require.NoError(t, pool.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{table}.Sanitize()).Scan(&rows))
		require.Equal(t, 1, rows, "only the key's row")
		require.NoError(t, waiter.Close(ctx))
	})

	// CloseWhileTheDialHangs: a listening connection whose dial never
	// answers (a stalled or blackholed proxy, no connect_timeout) does not
	// hold up Close, and the waiting claims end with ErrClosed.
	for name, mode := range map[string]faultproxy.Mode{"Stall": faultproxy.Stall, "Blackhole": faultproxy.Blackhole} {
		t.Run("CloseWhileTheDialHangs/"+name, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			p := pgtest.Proxy(t, "")
			p.SetMode(mode)
			holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
			waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(proxyDSN(t, p)))
			_, got := holdAndWait(ctx, t, holder, waiter)
			require.Eventually(t, func() bool { return p.Stats().Accepted > 0 }, 10*time.Second, time.Millisecond, "dialing")
			time.Sleep(100 * time.Millisecond)
			start := time.Now()
			cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
			defer cancel()
			require.NoError(t, waiter.Close(cctx))
			require.Less(t, time.Since(start), 2*time.Second, "Close while the dial hangs")
			require.ErrorIs(t, receive(t, got, time.Second).err, pglease.ErrClosed)
		})
	}

	// CloseWithManyWaiters: Close ends the waiting claims of many keys, and
	// of several on one key, closes the listening backend, and lets no
	// goroutine outlive it.
	t.Run("CloseWithManyWaiters", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(pgtest.Server.DSN()))
		var waits []<-chan claimResult
		for i := range 20 {
			key := fmt.Sprintf("job-%d", i)
			_, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			waits = append(waits, claimWaitAsync(ctx, waiter, key))
			if i == 0 {
				waits = append(waits, claimWaitAsync(ctx, waiter, key), claimWaitAsync(ctx, waiter, key))
			}
		}
		waitForMode(t, waiter, pglease.WaitByNotification)
		pid := pglease.ListenerPID(waiter)
		require.NoError(t, waiter.Close(ctx))
		for _, w := range waits {
			require.ErrorIs(t, receive(t, w, time.Second).err, pglease.ErrClosed)
		}
		// Close closed the listening connection; its backend exits as the
		// server reads that, a moment later on a busy machine.
		require.Eventually(t, func() bool {
			n := -1
			_ = pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
			return n == 0
		}, 5*time.Second, 20*time.Millisecond, "the listening backend ends once Close returned")
	})

	// PollingCeilingWithManyWaiters: a polling Locker with three waiters on
	// one key and one on each of three others sends, once its backoffs have
	// grown, at most a claim and a read per waiting key per MaxPollInterval.
	t.Run("PollingCeilingWithManyWaiters", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		stmts := &pgtest.Statements{}
		wpool := pgtest.Pool(t, stmts)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pgtest.NewFaultyDB(wpool), table, "waiter")
		keys := []string{"a", "b", "c", "d"}
		for _, key := range keys {
			_, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			claimWaitAsync(ctx, waiter, key)
		}
		claimWaitAsync(ctx, waiter, "a")
		claimWaitAsync(ctx, waiter, "a")
		waitForMode(t, waiter, pglease.WaitByPolling)
		time.Sleep(2 * time.Second) // backoffs grown
		const window = 4 * time.Second
		stmts.Reset()
		time.Sleep(window)
		claims, other := stmts.Count("claim"), stmts.Count("other")
		attempts := len(keys) * (int(window/pglease.MaxPollInterval) + 1)
		require.LessOrEqual(t, claims, attempts, "claims in %v", window)
		require.LessOrEqual(t, claims+other, 2*attempts, "statements in %v", window)
		require.GreaterOrEqual(t, claims, len(keys)*2, "still polling every key")
	})

	// PollingCeilingWithAShortLease: a polling waiter behind a live holder
	// whose TTL is short tries at each of the holder's expiries, which the
	// holder's heartbeat always beats: OPERATIONS.md promises at most 120
	// statements a minute (two a second) while it waits.
	t.Run("PollingCeilingWithAShortLease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		stmts := &pgtest.Statements{}
		wpool := pgtest.Pool(t, stmts)
		// Expiries 2.5 times a second, more than the ceiling; the holder's
		// heartbeat every 50 ms, so that a round held up 250 ms on a
		// loaded machine does not end its lease (every 133 ms by default,
		// a CI run lost it to a round in flight for 169 ms).
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(400*time.Millisecond), pglease.WithHeartbeatInterval(50*time.Millisecond))
		waiter := pgtest.Locker(t, pgtest.NewFaultyDB(wpool), table, "waiter", pglease.WithTTL(400*time.Millisecond))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByPolling)
		time.Sleep(2 * time.Second) // backoff grown
		const window = 3 * time.Second
		stmts.Reset()
		time.Sleep(window)
		sent := stmts.Count("claim") + stmts.Count("other")
		require.NoError(t, held.Err(), "the holder kept its lease")
		select {
		case r := <-got:
			t.Fatalf("the waiter got the key from a live holder: %v", r.err)
		default:
		}
		require.LessOrEqual(t, sent, 2*int(window/time.Second)+2, "statements of one polling waiter in %v", window)
	})

	// ElectorBehindPgBouncerHasOneLeader: three Electors through PgBouncer
	// in transaction mode, each with a listening connection past it, hand
	// leadership round: never two leaders at once, fences only grow, and
	// each handover is by notification.
	t.Run("ElectorBehindPgBouncerHasOneLeader", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
		pool := bouncedPool(t, b, pgx.QueryExecModeExec)
		table := pgtest.Table(t, pool)
		var electors []*pglease.Elector
		for i := range 3 {
			e, _ := bouncedElector(t, pool, table, fmt.Sprintf("e%d", i), pglease.WithListenDSN(pgtest.Server.DSN()))
			electors = append(electors, e)
			_ = e.IsLeader(ctx)
		}
		var (
			mu      sync.Mutex
			leaders int
			stop    = make(chan struct{})
			done    = make(chan struct{})
		)
		all := slices.Clone(electors)
		go func() {
			defer close(done)
			for {
				select {
				case <-stop:
					return
				default:
				}
				n := 0
				for _, e := range all {
					if _, ok := e.Leader(); ok {
						n++
					}
				}
				mu.Lock()
				leaders = max(leaders, n)
				mu.Unlock()
				time.Sleep(time.Millisecond)
			}
		}()
		var last int64
		for round := range 2 {
			var cur *pglease.Elector
			require.Eventually(t, func() bool {
				for _, e := range electors {
					if _, ok := e.Leader(); ok {
						cur = e
						return true
					}
				}
				return false
			}, 5*time.Second, time.Millisecond, "round %d: a leader", round)
			lease, _ := cur.Leader()
			require.Greater(t, lease.Fence(), last)
			last = lease.Fence()
			for _, e := range electors {
				if e != cur {
					waitForElectorMode(t, e)
				}
			}
			released := time.Now()
			require.NoError(t, cur.Close(ctx))
			var rest []*pglease.Elector
			for _, e := range electors {
				if e != cur {
					rest = append(rest, e)
				}
			}
			electors = rest
			require.Eventually(t, func() bool {
				for _, e := range electors {
					if _, ok := e.Leader(); ok {
						return true
					}
				}
				return false
			}, notifyBound, time.Millisecond, "round %d: handed over by notification", round)
			t.Logf("round %d: handed over in %v", round, time.Since(released).Round(time.Millisecond))
		}
		close(stop)
		<-done
		require.LessOrEqual(t, leaders, 1, "leaders at once")
	})

	// IdleSessionTimeoutDoesNotStorm: a server that ends idle sessions
	// (idle_session_timeout, as some DBAs set it) ends the listening
	// connection again and again; each new LISTEN makes every waiter try
	// once, so the dial must back off: the waiter may not send more than a
	// polling waiter would (a claim and a read per MaxPollInterval), nor
	// flap between modes many times a second.
	t.Run("IdleSessionTimeoutDoesNotStorm", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		stmts := &pgtest.Statements{}
		wpool := pgtest.Pool(t, stmts)
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		dsn := dsnWith(cfg, cfg.Host, cfg.Port, cfg.User, cfg.Password, cfg.Database, "-c idle_session_timeout=200")
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, wpool, table, "waiter", pglease.WithHook(events.Hook), pglease.WithListenDSN(dsn))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		time.Sleep(time.Second)
		const window = 3 * time.Second
		stmts.Reset()
		flapsBefore := events.Count(pglease.EventWaitByPolling)
		time.Sleep(window)
		claims, flaps := stmts.Count("claim"), events.Count(pglease.EventWaitByPolling)-flapsBefore
		t.Logf("%d claims, %d switches to polling in %v", claims, flaps, window)
		require.LessOrEqual(t, claims, int(window/pglease.MaxPollInterval)+1, "claims of one waiting key in %v", window)
		require.LessOrEqual(t, flaps, 3, "switches to polling in %v", window)
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, pollBound).err)
	})

	// ListenDSNAtThePoolerIsNotTrusted: a DSN that points at PgBouncer in
	// transaction mode too (the mistake the option exists to avoid): the
	// probe does not come back, WaitMode never says notification, and the
	// waiter gets the key within the polling bound.
	t.Run("ListenDSNAtThePoolerIsNotTrusted", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		b := pgbouncer.New(t, pgtest.Server.DSN(), pgbouncer.Options{PoolMode: "transaction", PoolSize: 3})
		pool := bouncedPool(t, b, pgx.QueryExecModeExec)
		table := pgtest.Table(t, pool)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(b.DSN()))
		held, got := holdAndWait(ctx, t, holder, waiter)
		var seen []pglease.WaitMode
		require.Eventually(t, func() bool {
			m, reason := waiter.WaitMode()
			seen = append(seen, m)
			return m == pglease.WaitByPolling && strings.Contains(reason, "did not arrive")
		}, 10*time.Second, time.Millisecond)
		require.NotContains(t, seen, pglease.WaitByNotification)
		time.Sleep(time.Second)
		released := time.Now()
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, 5*time.Second).err)
		require.LessOrEqual(t, time.Since(released), pollBound)
	})

	// ServerRestartListensAgain: after the server restarts, the listening
	// connection is dialed again and the Locker waits by notification
	// again: a release is seen at once.
	t.Run("ServerRestartListensAgain", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		srv := pgtest.PrivateServer(t)
		pool := pgtest.PoolAt(t, srv.DSN(), nil)
		table := pgtest.Table(t, pool)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		events := pgtest.NewEvents(t)
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(srv.DSN()), pglease.WithHook(events.Hook))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		// The wait has reached the server: a first attempt that meets the
		// restart fails the wait at once, as a wrong address would.
		events.WaitFor(t, pglease.EventContended, 10*time.Second)
		pid := pglease.ListenerPID(waiter)
		require.NoError(t, srv.Restart(ctx, pgserver.Fast))
		pool.Reset()
		require.Eventually(t, func() bool {
			m, _ := waiter.WaitMode()
			return m == pglease.WaitByNotification && pglease.ListenerPID(waiter) != pid
		}, 10*time.Second, 2*time.Millisecond, "listening again after the restart")
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, notifyBound)
		require.NoError(t, r.err)
		require.NoError(t, r.lease.Unlock(ctx))
	})

	// ReleaseDuringTheProbeIsSeen: a release notified after LISTEN but
	// before the probe came back reaches the waiter at once.
	t.Run("ReleaseDuringTheProbeIsSeen", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		db := &probeGate{DB: pool, entered: make(chan struct{}), gate: make(chan struct{})}
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, db, table, "waiter", pglease.WithListenDSN(pgtest.Server.DSN()))
		held, got := holdAndWait(ctx, t, holder, waiter)
		select {
		case <-db.entered:
		case <-time.After(10 * time.Second):
			t.Fatal("no probe sent")
		}
		time.Sleep(1500 * time.Millisecond) // the waiter's backoff has grown
		require.NoError(t, held.Unlock(ctx))
		time.Sleep(50 * time.Millisecond)
		released := time.Now()
		close(db.gate)
		r := receive(t, got, notifyBound)
		require.NoError(t, r.err)
		require.Less(t, time.Since(released), 500*time.Millisecond, "woken by the notification received while probing")
	})

	// ProbeCancelRequestNeverReachesALaterClaim: a probe given up in flight
	// (its Locker closed) on a pool whose pgx cancels by cancel request
	// closes its connection: the late cancel request never reaches a later
	// claim there (with a synchronous standby, it would cut its wait).
	t.Run("ProbeCancelRequestNeverReachesALaterClaim", testListenProbeCancel)

	// ResetConnectionMissesNoRelease: a listening connection reset by the
	// network (RST) just before a release: the release is seen at once
	// all the same, on a new connection.
	t.Run("ResetConnectionMissesNoRelease", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		p := pgtest.Proxy(t, "")
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(proxyDSN(t, p)))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		require.Equal(t, 1, p.ResetAll())
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, notifyBound)
		require.NoError(t, r.err)
		require.Eventually(t, func() bool { m, _ := waiter.WaitMode(); return m == pglease.WaitByNotification },
			10*time.Second, 2*time.Millisecond)
	})

	// ExpiryIsSeenOnTime: a holder that vanishes (its network cut) releases
	// nothing; its lease lapses at its expiry, which waiters in both modes
	// try at, within a round trip.
	for _, mode := range []string{"notification", "polling"} {
		t.Run("ExpiryIsSeenOnTime/"+mode, func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			const ttl = 1500 * time.Millisecond
			cut := pgtest.NewFaultyDB(pool)
			holder := pgtest.Locker(t, cut, table, "holder", pglease.WithTTL(ttl))
			var waiter *pglease.Locker
			if mode == "notification" {
				waiter = pgtest.Locker(t, pgtest.NewFaultyDB(pool), table, "waiter", pglease.WithListenDSN(pgtest.Server.DSN()))
			} else {
				waiter = pgtest.Locker(t, pgtest.NewFaultyDB(pool), table, "waiter")
			}
			held, got := holdAndWait(ctx, t, holder, waiter)
			claimed := time.Now()
			cut.Cut(errors.New("network cut"))
			r := receive(t, got, 10*time.Second)
			require.NoError(t, r.err)
			took := time.Since(claimed)
			require.Greater(t, r.lease.Fence(), held.Fence())
			require.GreaterOrEqual(t, took, ttl-100*time.Millisecond, "not before the expiry")
			require.LessOrEqual(t, took, ttl+500*time.Millisecond, "at the expiry")
			m, _ := waiter.WaitMode()
			require.Equal(t, mode, m.String())
		})
	}

	// LostConnectionMakesWaitersPoll: once the listening connection is lost
	// and cannot be dialed again (the direct route down, the pooler up),
	// WaitMode says polling; a waiter then asleep on the notified safety
	// net (2.5-5s) must poll too, seeing a release within the polling
	// bound.
	t.Run("LostConnectionMakesWaitersPoll", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		p := pgtest.Proxy(t, "")
		stmts := &pgtest.Statements{}
		wpool := pgtest.Pool(t, stmts)
		holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
		waiter := pgtest.Locker(t, wpool, table, "waiter", pglease.WithListenDSN(proxyDSN(t, p)))
		held, got := holdAndWait(ctx, t, holder, waiter)
		waitForMode(t, waiter, pglease.WaitByNotification)
		// Just after an attempt, so that the waiter sleeps a whole notified
		// pause from now.
		n := stmts.Count("claim")
		require.Eventually(t, func() bool { return stmts.Count("claim") > n }, 10*time.Second, time.Millisecond)
		time.Sleep(100 * time.Millisecond)
		p.Stop()
		waitForMode(t, waiter, pglease.WaitByPolling)
		released := time.Now()
		require.NoError(t, held.Unlock(ctx))
		r := receive(t, got, 10*time.Second)
		require.NoError(t, r.err)
		took := time.Since(released)
		mode, reason := waiter.WaitMode()
		require.LessOrEqual(t, took, pollBound, "released key taken %v after the release; WaitMode: %v %q", took, mode, reason)
	})

	// ManyTablesOnOneServer: Lockers on eight tables of one server, each
	// with a listening connection of its own, wake by notification on
	// their own table's releases.
	t.Run("ManyTablesOnOneServer", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		type pair struct {
			held *pglease.Lease
			got  <-chan claimResult
		}
		var pairs []pair
		pids := map[uint32]bool{}
		for range 8 {
			table := pgtest.Table(t, pool)
			holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
			waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithListenDSN(pgtest.Server.DSN()))
			held, got := holdAndWait(ctx, t, holder, waiter)
			waitForMode(t, waiter, pglease.WaitByNotification)
			pids[pglease.ListenerPID(waiter)] = true
			pairs = append(pairs, pair{held, got})
		}
		require.Len(t, pids, 8, "a listening backend per Locker")
		time.Sleep(time.Second)
		for _, p := range pairs {
			require.NoError(t, p.held.Unlock(ctx))
		}
		for _, p := range pairs {
			require.NoError(t, receive(t, p.got, notifyBound).err)
		}
	})
}

// probeGate is a DB that holds the first probe notification until gate is
// closed, saying on entered that it came.
type probeGate struct {
	pglease.DB
	once    sync.Once
	entered chan struct{}
	gate    chan struct{}
}

func (g *probeGate) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	if strings.Contains(sql, "pg_notify($1, $2)") {
		first := false
		g.once.Do(func() { first = true })
		if first {
			close(g.entered)
			select {
			case <-g.gate:
			case <-ctx.Done():
				return pgconn.CommandTag{}, ctx.Err()
			}
		}
	}
	return g.DB.Exec(ctx, sql, args...)
}

// proxyDSN is the shared server's DSN through p.
func proxyDSN(t *testing.T, p *faultproxy.Proxy) string {
	t.Helper()
	cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
	require.NoError(t, err)
	return dsnWith(cfg, p.Host(), p.Port(), cfg.User, cfg.Password, cfg.Database, "")
}

// dsnWith is a keyword/value DSN on cfg's TLS-less settings with the given
// parts; options is the server's "options" parameter when not empty.
func dsnWith(_ *pgx.ConnConfig, host string, port uint16, user, password, db, options string) string {
	q := func(s string) string {
		return "'" + strings.ReplaceAll(strings.ReplaceAll(s, `\`, `\\`), `'`, `\'`) + "'"
	}
	dsn := fmt.Sprintf("host=%s port=%d user=%s dbname=%s sslmode=disable", q(host), port, q(user), q(db))
	if password != "" {
		dsn += " password=" + q(password)
	}
	if options != "" {
		dsn += " options=" + q(options)
	}
	return dsn
}

func waitForMode(t *testing.T, l *pglease.Locker, want pglease.WaitMode) {
	t.Helper()
	if !waitForModeWithin(l, want, 10*time.Second) {
		m, reason := l.WaitMode()
		t.Fatalf("WaitMode %v %q, want %v", m, reason, want)
	}
}

func waitForModeWithin(l *pglease.Locker, want pglease.WaitMode, limit time.Duration) bool {
	deadline := time.Now().Add(limit)
	for time.Now().Before(deadline) {
		if m, _ := l.WaitMode(); m == want {
			return true
		}
		time.Sleep(2 * time.Millisecond)
	}
	return false
}

func waitForElectorMode(t *testing.T, e *pglease.Elector) {
	t.Helper()
	require.Eventually(t, func() bool { m, _ := e.WaitMode(); return m == pglease.WaitByNotification },
		10*time.Second, 2*time.Millisecond, "follower waiting by notification")
}

// TestWithListenDSN pins the option that gives a Locker a connection of its
// own to LISTEN on: refused at New when it cannot be used, and a waiter
// woken by notification whatever the DB (TestPgBouncer runs it behind a
// pooler).
func TestWithListenDSN(t *testing.T) {
	t.Parallel()

	t.Run("RefusesADSNThatDoesNotParse", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		for _, dsn := range []string{"", "  ", "postgres://u:secret@host:notaport/db", "host=h port=x"} {
			_, err := pglease.New(pool, pglease.WithListenDSN(dsn))
			require.ErrorIs(t, err, pglease.ErrInvalidOption, "%q", dsn)
			require.Equal(t, "WithListenDSN", pglease.OptionNamed(err))
			require.Contains(t, err.Error(), "WithListenDSN")
			require.NotContains(t, err.Error(), "secret", "the password is not repeated")
		}
	})

	t.Run("ListensOnItsOwnConnectionWhateverTheDB", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		for name, db := range map[string]pglease.DB{"wrapper": pgtest.NewFaultyDB(pool), "conn": conn} {
			key := "job-" + name
			holder := pgtest.Locker(t, pool, table, "holder-"+name)
			waiter := pgtest.Locker(t, db, table, "waiter-"+name, pglease.WithListenDSN(pgtest.Server.DSN()))
			held, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			got := claimWaitAsync(ctx, waiter, key)
			require.Eventually(t, func() bool { m, _ := waiter.WaitMode(); return m == pglease.WaitByNotification },
				10*time.Second, 2*time.Millisecond, "%s: waiting by notification", name)
			pid := pglease.ListenerPID(waiter)
			require.NotZero(t, pid)
			if c, ok := db.(*pgx.Conn); ok {
				require.NotEqual(t, c.PgConn().PID(), pid, "a connection of its own")
			}
			require.NoError(t, held.Unlock(ctx))
			// The default TTL and a safety net of 2.5s or more: only the
			// notification wakes it this soon.
			r := receive(t, got, 2*time.Second)
			require.NoError(t, r.err, name)
			require.NoError(t, r.lease.Unlock(ctx))

			require.NoError(t, waiter.Close(ctx))
			require.Eventually(t, func() bool {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
				return err == nil && n == 0
			}, 5*time.Second, 10*time.Millisecond, "%s: Close closes the listening connection", name)
		}
	})

	t.Run("PollsWhileItsConnectionCannotBeHad", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook),
			pglease.WithListenDSN("postgres://nobody@127.0.0.1:1/none?connect_timeout=1"))
		held, got := holdAndWait(ctx, t, holder, waiter)
		ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		for !errorContains(ev.Err, "dialing") {
			ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		}
		require.Contains(t, ev.Err.Error(), "WithListenDSN (127.0.0.1:1)", "names the option and where it dials")
		require.Contains(t, ev.Err.Error(), "each waiting key tried about once per", "says what polling costs")
		mode, reason := waiter.WaitMode()
		require.Equal(t, pglease.WaitByPolling, mode)
		require.Contains(t, reason, "WithListenDSN")
		require.Zero(t, pglease.ListenerPID(waiter), "the pool lends it no connection instead")
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, 5*time.Second).err, "woken by polling")
	})
}

func errorContains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}

func testListenProbeCancel(t *testing.T) {
	t.Parallel()
	ctx, direct, table := pgtest.Setup(t)
	late := pgtest.NewLateCancel(t, 2500*time.Millisecond) // past pgx's wait for its answer
	pool := pgtest.CancelRequestPool(t, direct.Config().ConnString(), func(cfg *pgxpool.Config) {
		cfg.MaxConns = 3
		cfg.ShouldPing = func(context.Context, pgxpool.ShouldPingParams) bool { return false } // a late request finds the next statement
		cfg.ConnConfig.DialFunc = late.Dial(cfg.ConnConfig.DialFunc)
		cfg.ConnConfig.Tracer = onStatement{sql: sqlstmt.Probe, before: func(c *pgx.Conn) { late.DelayNextReplyOf(c, 2*time.Second) }}
	})
	holder := pgtest.Locker(t, pool, table, "holder", pglease.WithTTL(30*time.Second))
	waiter := pgtest.Locker(t, pool, table, "waiter")
	_, got := holdAndWait(ctx, t, holder, waiter)
	select {
	case <-late.ReplyHeld(): // the probe is in flight, its reply held back
	case <-time.After(10 * time.Second):
		t.Fatal("no probe sent")
	}
	require.NoError(t, waiter.Close(ctx)) // the probe's context ends in flight
	receive(t, got, 10*time.Second)
	require.Positive(t, late.Sent(), "pgx sent a cancel request for the probe: the case is the one described")

	// A claim whose context never ends waits on a row lock until the late
	// cancel request has landed, and half a second more.
	freeRow(ctx, t, direct, table, "locked")
	end := pgtest.LockRow(t, direct, table, "locked")
	defer end(false)
	claimPastLanded(ctx, t, holder, late, end, "locked", "a probe")
}
