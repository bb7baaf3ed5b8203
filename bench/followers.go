package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgbouncer"
)

// The paths of the followers study: how a follower's pool reaches the
// server, and where its Locker LISTENs.
const (
	viaDirect         = "direct connection"
	viaBouncerPolling = "PgBouncer, polling"
	viaBouncerListen  = "PgBouncer + WithListenDSN"
)

// followerPoint is what the followers of one path sent while a leader held
// the key, and how soon one of them took over at its release.
type followerPoint struct {
	Path       string
	Followers  int
	Window     time.Duration
	Statements int64   // every statement of the followers' pools in Window
	PerMinute  float64 // statements per follower per minute
	Mode       string  // how the followers' waiting claims woke at the end of Window
	Takeover   time.Duration
}

// statementCounter counts every statement its pools send.
type statementCounter struct{ n atomic.Int64 }

func (c *statementCounter) TraceQueryStart(ctx context.Context, _ *pgx.Conn, _ pgx.TraceQueryStartData) context.Context {
	c.n.Add(1)
	return ctx
}

func (c *statementCounter) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// studyFollowers measures, for each path, a leader Elector holding the
// default leader key (TTL 60s, so that nothing but a release hands it over)
// and n follower Electors, each on its own pool whose statements are
// counted client-side, for window after they settled (the probe that finds
// PgBouncer dropping notifications takes 2s); then the leader resigns and
// the study times the first follower to take over.
func studyFollowers(ctx context.Context, dsn string, n int, window time.Duration, logf func(string, ...any)) ([]followerPoint, error) {
	b, err := pgbouncer.Start(ctx, dsn, pgbouncer.Options{PoolMode: "transaction", PoolSize: 4})
	if err != nil {
		return nil, err
	}
	defer func() { _ = b.Close() }()
	var out []followerPoint
	for i, path := range []string{viaDirect, viaBouncerPolling, viaBouncerListen} {
		var opts []pglease.Option
		poolDSN, mode := b.DSN(), pgx.QueryExecModeExec
		switch path {
		case viaDirect:
			poolDSN, mode = dsn, pgx.QueryExecModeCacheStatement
		case viaBouncerListen:
			opts = listenOptions(dsn)
			if opts == nil {
				logf("  %s: not in this build", path)
				continue
			}
		}
		p, err := measureFollowers(ctx, fmt.Sprintf("followers_%d", i), dsn, poolDSN, mode, n, window, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", path, err)
		}
		p.Path = path
		logf("  %-26s %d followers, %v: %6.1f statements/follower/minute (%s), takeover %v",
			path, n, window, p.PerMinute, p.Mode, p.Takeover.Round(time.Millisecond))
		out = append(out, p)
	}
	return out, nil
}

func measureFollowers(ctx context.Context, table, dsn, poolDSN string, mode pgx.QueryExecMode, n int, window time.Duration, opts []pglease.Option) (followerPoint, error) {
	leaderPool, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return followerPoint{}, err
	}
	defer leaderPool.Close()
	if err := pglease.Migrate(ctx, leaderPool, pglease.WithTable(table)); err != nil {
		return followerPoint{}, err
	}
	base := []pglease.Option{pglease.WithTable(table), pglease.WithLogger(quiet)}
	leader, err := newStudyElector(leaderPool, append(base, pglease.WithHolder("leader")))
	if err != nil {
		return followerPoint{}, err
	}
	defer func() { _ = leader.locker.Close(context.Background()) }()
	if err := leader.IsLeader(ctx); err != nil {
		return followerPoint{}, fmt.Errorf("leader: %w", err)
	}

	var cnt statementCounter
	followers := make([]*studyElector, 0, n)
	defer func() {
		for _, f := range followers {
			_ = f.locker.Close(context.Background())
			f.pool.Close()
		}
	}()
	for i := range n {
		cfg, err := pgxpool.ParseConfig(poolDSN)
		if err != nil {
			return followerPoint{}, err
		}
		cfg.MaxConns = 2
		cfg.ConnConfig.DefaultQueryExecMode = mode
		cfg.ConnConfig.Tracer = &cnt
		pool, err := pgxpool.NewWithConfig(ctx, cfg)
		if err != nil {
			return followerPoint{}, err
		}
		f, err := newStudyElector(pool, append(append(base, pglease.WithHolder(fmt.Sprintf("follower-%d", i))), opts...))
		if err != nil {
			pool.Close()
			return followerPoint{}, err
		}
		f.pool = pool
		followers = append(followers, f)
		if err := f.IsLeader(ctx); !errors.Is(err, pglease.ErrHeld) {
			return followerPoint{}, fmt.Errorf("follower %d: %w, want ErrHeld", i, err)
		}
	}
	if err := sleep(ctx, 3*time.Second); err != nil { // LISTEN, and its probe: found dropped after 2s
		return followerPoint{}, err
	}
	start := cnt.n.Load()
	if err := sleep(ctx, window); err != nil {
		return followerPoint{}, err
	}
	sent := cnt.n.Load() - start
	m, _ := followers[0].mode.Load().(string)

	released := time.Now()
	if err := leader.Close(ctx); err != nil {
		return followerPoint{}, err
	}
	var takeover time.Duration
	for takeover == 0 {
		for _, f := range followers {
			if _, ok := f.Leader(); ok {
				takeover = time.Since(released)
			}
		}
		if err := sleep(ctx, time.Millisecond); err != nil {
			return followerPoint{}, err
		}
		if time.Since(released) > time.Minute {
			return followerPoint{}, errors.New("no follower took over within a minute of the release")
		}
	}
	return followerPoint{
		Followers: n, Window: window, Statements: sent, Mode: m, Takeover: takeover,
		PerMinute: float64(sent) / float64(n) / window.Minutes(),
	}, nil
}

// studyElector is an Elector on the default leader key and what it owns.
type studyElector struct {
	*pglease.Elector
	locker *pglease.Locker
	pool   *pgxpool.Pool // a follower's own pool; nil for the leader
	mode   atomic.Value  // how its waiting claims wake: the last wait event's
}

func newStudyElector(db pglease.DB, opts []pglease.Option) (*studyElector, error) {
	s := &studyElector{}
	s.mode.Store("idle")
	watch := pglease.WithHook(func(ev pglease.Event) {
		switch ev.Kind {
		case pglease.EventWaitByNotification:
			s.mode.Store("notification")
		case pglease.EventWaitByPolling:
			s.mode.Store("polling")
		}
	})
	s.locker = pglease.NewLocker(db, append(opts[:len(opts):len(opts)], watch)...)
	e, err := pglease.NewElector(s.locker, "gocron-leader")
	if err != nil {
		_ = s.locker.Close(context.Background())
		return nil, err
	}
	s.Elector = e
	return s, nil
}

func sleep(ctx context.Context, d time.Duration) error {
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-time.After(d):
		return nil
	}
}

// followersMarkdown is the followers study's table.
func followersMarkdown(points []followerPoint) string {
	var b strings.Builder
	b.WriteString("## Followers waiting for the leader key\n\n")
	if len(points) > 0 {
		fmt.Fprintf(&b, "A leader holds the key (TTL 60s); %d follower Electors, each on its own pool, wait for %v; every statement of their pools is counted. Then the leader resigns.\n\n",
			points[0].Followers, points[0].Window)
	}
	b.WriteString("| path | wait mode | statements per follower per minute | takeover after the release |\n|---|---|---:|---:|\n")
	for _, p := range points {
		fmt.Fprintf(&b, "| %s | %s | %.1f | %v |\n", p.Path, p.Mode, p.PerMinute, p.Takeover.Round(time.Millisecond))
	}
	return b.String()
}

// runFollowers is -followers: the followers study alone, written to
// followers.md.
func runFollowers(ctx context.Context, s settings, dsn string, logf func(string, ...any)) error {
	logf("followers study: %d followers, %v per path", s.followers, s.followerWindow)
	points, err := studyFollowers(ctx, dsn, s.followers, s.followerWindow, logf)
	if err != nil {
		return fmt.Errorf("followers study: %w", err)
	}
	report := followersMarkdown(points)
	if err := os.WriteFile(filepath.Join(s.out, "followers.md"), []byte(report), 0o644); err != nil {
		return err
	}
	fmt.Print(report)
	logf("done; wrote followers.md to %s", s.out)
	return nil
}
