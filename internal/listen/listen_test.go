package listen_test

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/listen"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/internal/sqlstmt"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// run is a Listener running until the test ends, and what it reported.
type run struct {
	notified chan string
	ready    chan uint32
	polling  chan error
	done     chan struct{}
	cancel   context.CancelFunc
}

// start runs a Listener on pool that LISTENs on the channel of table and
// sends its probe on probeChannel.
func start(t *testing.T, pool *pgxpool.Pool, table, probeChannel string, probeTimeout time.Duration) *run {
	t.Helper()
	send := func(ctx context.Context, sql string, args ...any) error {
		_, err := pool.Exec(ctx, sql, args...)
		return err
	}
	return startOn(t, listen.PoolSource{Pool: pool, Send: send}, table, probeChannel, probeTimeout)
}

// startOn is start on any source.
func startOn(t *testing.T, src listen.Source, table, probeChannel string, probeTimeout time.Duration) *run {
	t.Helper()
	r := &run{notified: make(chan string, 100), ready: make(chan uint32, 10), polling: make(chan error, 10), done: make(chan struct{})}
	ln := &listen.Listener{
		Source:       src,
		Listen:       sqlstmt.Render(sqlstmt.Listen, pgx.Identifier{table}),
		Probe:        sqlstmt.Probe,
		Channel:      probeChannel,
		ProbeTimeout: probeTimeout,
		Notify:       func(p string) { r.notified <- p },
		Ready:        func(pid uint32) { r.ready <- pid },
		Polling:      func(err error) { r.polling <- err },
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	go func() { ln.Run(ctx); close(r.done) }()
	t.Cleanup(func() { cancel(); <-r.done })
	return r
}

func recv[T any](t *testing.T, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(10 * time.Second):
		t.Fatalf("no %s", what)
		var zero T
		return zero
	}
}

func TestListener(t *testing.T) {
	t.Parallel()

	t.Run("NotifiesEachPayloadInOrderButNotTheProbe", func(t *testing.T) {
		t.Parallel()
		ctx, pool := pgtest.Ctx(t), pgtest.Pool(t, nil)
		table := pgtest.TableName()
		ch := sqlstmt.Channel(table)
		r := start(t, pool, table, ch, 0)
		require.Positive(t, recv(t, r.ready, "Ready"))
		for _, p := range []string{"a", "b", "c"} {
			_, err := pool.Exec(ctx, sqlstmt.Probe, ch, p)
			require.NoError(t, err)
		}
		for _, want := range []string{"a", "b", "c"} {
			require.Equal(t, want, recv(t, r.notified, "notification "+want))
		}
		require.Empty(t, r.polling)
	})

	t.Run("ListensAgainAfterTheConnectionFails", func(t *testing.T) {
		t.Parallel()
		ctx, pool := pgtest.Ctx(t), pgtest.Pool(t, nil)
		table := pgtest.TableName()
		ch := sqlstmt.Channel(table)
		r := start(t, pool, table, ch, 0)
		pid := recv(t, r.ready, "Ready")
		_, err := pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		reason := recv(t, r.polling, "Polling after the connection failed")
		require.Contains(t, reason.Error(), "the listening connection failed")
		again := recv(t, r.ready, "Ready on a new connection")
		require.NotEqual(t, pid, again, "a new backend listens")
		_, err = pool.Exec(ctx, sqlstmt.Probe, ch, "after")
		require.NoError(t, err)
		require.Equal(t, "after", recv(t, r.notified, "a notification on the new connection"))
	})

	t.Run("TriesALostProbeAgain", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		table := pgtest.TableName()
		r := start(t, pool, table, sqlstmt.Channel(table)+"-elsewhere", 50*time.Millisecond)
		start := time.Now()
		require.ErrorIs(t, recv(t, r.polling, "Polling"), listen.ErrNoDelivery)
		first := time.Since(start)
		require.ErrorIs(t, recv(t, r.polling, "Polling again"), listen.ErrNoDelivery)
		require.GreaterOrEqual(t, time.Since(start)-first, 5*time.Second, "after the lost probe's pause")
		require.Empty(t, r.ready, "Ready without a probe")
		select {
		case <-r.done:
			t.Fatal("Run returned while its context goes on")
		default:
		}
	})

	t.Run("ReturnsWhenItsContextEnds", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		table := pgtest.TableName()
		r := start(t, pool, table, sqlstmt.Channel(table), 0)
		recv(t, r.ready, "Ready")
		r.cancel()
		recv(t, r.done, "the end of Run")
		select {
		case err := <-r.polling:
			t.Fatalf("Polling reported %v at the end of its context", err)
		default:
		}
	})

	t.Run("DialsAConnectionOfItsOwnAndDialsAgainAfterItFails", func(t *testing.T) {
		t.Parallel()
		ctx, pool := pgtest.Ctx(t), pgtest.Pool(t, nil)
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		sent := make(chan string, 10)
		src := listen.DialSource{Config: cfg, Send: func(ctx context.Context, sql string, args ...any) error {
			sent <- sql
			_, err := pool.Exec(ctx, sql, args...)
			return err
		}}
		table := pgtest.TableName()
		ch := sqlstmt.Channel(table)
		r := startOn(t, src, table, ch, 0)
		pid := recv(t, r.ready, "Ready")
		require.Equal(t, sqlstmt.Probe, recv(t, sent, "the probe, sent with Send"))
		require.Equal(t, int32(0), pool.Stat().AcquiredConns(), "the pool lends it nothing")
		_, err = pool.Exec(ctx, sqlstmt.Probe, ch, "a")
		require.NoError(t, err)
		require.Equal(t, "a", recv(t, r.notified, "a notification"))

		_, err = pool.Exec(ctx, `SELECT pg_terminate_backend($1)`, pid)
		require.NoError(t, err)
		require.Contains(t, recv(t, r.polling, "Polling after the connection failed").Error(), "the listening connection failed")
		require.NotEqual(t, pid, recv(t, r.ready, "Ready on a new connection"))
		_, err = pool.Exec(ctx, sqlstmt.Probe, ch, "after")
		require.NoError(t, err)
		require.Equal(t, "after", recv(t, r.notified, "a notification on the new connection"))
	})

	t.Run("NoticesASilentDeadConnection", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		p := pgtest.Proxy(t, "")
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		cfg.Host, cfg.Port = p.Host(), p.Port()
		src := listen.DialSource{Config: cfg, Send: func(ctx context.Context, sql string, args ...any) error {
			_, err := pool.Exec(ctx, sql, args...)
			return err
		}}
		table := pgtest.TableName()
		r := startOn(t, src, table, sqlstmt.Channel(table), 0)
		recv(t, r.ready, "Ready")
		time.Sleep(2 * listen.DefaultCheckInterval) // pinged and alive
		select {
		case err := <-r.polling:
			t.Fatalf("Polling on a live connection: %v", err)
		default:
		}
		p.SetMode(faultproxy.Blackhole)
		lost := time.Now()
		err = recv(t, r.polling, "Polling on a half-open connection")
		require.Contains(t, err.Error(), "did not answer a ping")
		require.Less(t, time.Since(lost), listen.DefaultCheckInterval+listen.DefaultCheckTimeout+500*time.Millisecond)
	})

	t.Run("GivesUpADialThatHangsAndDialsAgain", func(t *testing.T) {
		t.Parallel()
		p := pgtest.Proxy(t, "")
		p.SetMode(faultproxy.Blackhole)
		cfg, err := pgx.ParseConfig(pgtest.Server.DSN())
		require.NoError(t, err)
		cfg.Host, cfg.Port, cfg.ConnectTimeout = p.Host(), p.Port(), 0
		table := pgtest.TableName()
		polling := make(chan error, 10)
		ln := &listen.Listener{
			Source: listen.DialSource{Config: cfg, Send: func(context.Context, string, ...any) error {
				t.Error("a probe sent without a listening connection")
				return nil
			}},
			Listen:       sqlstmt.Render(sqlstmt.Listen, pgx.Identifier{table}),
			Probe:        sqlstmt.Probe,
			Channel:      sqlstmt.Channel(table),
			SetupTimeout: 200 * time.Millisecond,
			Notify:       func(string) { t.Error("a notification without a connection") },
			Ready:        func(uint32) { t.Error("Ready without a connection") },
			Polling:      func(err error) { polling <- err },
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan struct{})
		go func() { ln.Run(ctx); close(done) }()
		t.Cleanup(func() { cancel(); <-done })
		for range 2 { // the first hung dial and the one after its pause
			require.Contains(t, recv(t, polling, "Polling").Error(), "gave up after 200ms")
		}
	})

	t.Run("ReportsAFailedDialAndDialsAgain", func(t *testing.T) {
		t.Parallel()
		cfg, err := pgx.ParseConfig("postgres://nobody@127.0.0.1:1/none?connect_timeout=1")
		require.NoError(t, err)
		src := listen.DialSource{Config: cfg, Send: func(context.Context, string, ...any) error {
			t.Error("a probe sent without a listening connection")
			return nil
		}}
		table := pgtest.TableName()
		r := startOn(t, src, table, sqlstmt.Channel(table), 0)
		for range 2 { // the first failure and the one after its pause
			err := recv(t, r.polling, "Polling")
			require.Contains(t, err.Error(), "dialing 127.0.0.1:1")
			require.NotErrorIs(t, err, listen.ErrNoDelivery)
		}
		require.Empty(t, r.ready)
	})
}
