package pgtest

import (
	"context"
	"errors"
	"fmt"
	"math/rand"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/driver"
)

// ErrReplyLost is what a NemesisDB returns instead of the result of a
// statement that ran: the connection broke after the server committed.
var ErrReplyLost = errors.New("pgtest: connection lost after the statement ran (reply lost)")

// errGaveUp is what a NemesisDB returns for a statement it sends late: the
// caller's wait timed out, as if its context had ended.
var errGaveUp = fmt.Errorf("pgtest: gave up waiting for the reply: %w", context.DeadlineExceeded)

// lateTimeout bounds the run of a statement a NemesisDB delivers late.
const lateTimeout = 10 * time.Second

// NemesisDB wraps a DB and injects, by statement kind (StatementKind) and
// at random from a seed, the faults of a network a reply or a request can
// be lost on: replies lost after the statement ran (the caller gets
// ErrReplyLost, the server kept what it did), and statements delivered
// after their sender gave up (the caller gets a timeout at once, and the
// statement runs later, after a random delay, whatever became of the
// caller). It can also hold every statement for a while before it is
// sent, to keep them in flight. Statements not chosen pass through.
//
// The statements sent late run on goroutines that Drain waits for; the
// test's cleanup delivers those still pending at once and waits for them.
type NemesisDB struct {
	db pglease.DB

	mu      sync.Mutex
	rnd     *rand.Rand
	lose    map[string]float64 // kind -> probability that a reply is lost
	late    map[string]float64 // kind -> probability that a statement is sent late
	from    time.Duration      // the shortest delay of a late statement
	to      time.Duration      // and the longest
	slow    time.Duration      // every statement waits this long before it is sent
	counts  map[string]int     // "lost claim", "late release", ...
	flushed chan struct{}      // closed at cleanup: late statements go at once
	closed  bool

	pending sync.WaitGroup // late statements not yet run
}

// NewNemesisDB wraps db, letting every statement through until told
// otherwise; seed drives its choices.
func NewNemesisDB(tb testing.TB, db pglease.DB, seed int64) *NemesisDB {
	tb.Helper()
	n := &NemesisDB{
		db: db, rnd: rand.New(rand.NewSource(seed)),
		lose: map[string]float64{}, late: map[string]float64{}, counts: map[string]int{},
		flushed: make(chan struct{}),
	}
	tb.Cleanup(n.close)
	return n
}

// LoseReplies makes each statement of kind lose its reply with probability
// p once it ran; 0 stops it.
func (n *NemesisDB) LoseReplies(kind string, p float64) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.lose[kind] = p
}

// DeliverLate makes each statement of kind, with probability p, fail at
// once with a timeout and run later, from from to to after (uniformly);
// p 0 stops it. The delays hold for every kind.
func (n *NemesisDB) DeliverLate(kind string, p float64, from, to time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.late[kind] = p
	n.from, n.to = from, max(from, to)
}

// Slow makes every statement wait d before it is sent (0: no wait), as
// over a slow link; a context that ends meanwhile fails it unsent.
func (n *NemesisDB) Slow(d time.Duration) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.slow = d
}

// Heal stops every fault; statements already due late still come.
func (n *NemesisDB) Heal() {
	n.mu.Lock()
	defer n.mu.Unlock()
	clear(n.lose)
	clear(n.late)
	n.slow = 0
}

// Drain waits until every statement sent late has run, or ctx ends.
func (n *NemesisDB) Drain(ctx context.Context) error {
	done := make(chan struct{})
	go func() {
		n.pending.Wait()
		close(done)
	}()
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("pgtest: statements sent late still pending: %w", ctx.Err())
	}
}

// Counts returns how many faults were injected, by fault and kind ("lost
// claim", "late heartbeat").
func (n *NemesisDB) Counts() map[string]int {
	n.mu.Lock()
	defer n.mu.Unlock()
	out := make(map[string]int, len(n.counts))
	for k, v := range n.counts {
		out[k] = v
	}
	return out
}

func (n *NemesisDB) close() {
	n.mu.Lock()
	if !n.closed {
		n.closed = true
		close(n.flushed)
	}
	n.mu.Unlock()
	n.pending.Wait()
}

type fault int

const (
	pass fault = iota
	loseReply
	sendLate
)

// choose decides the fate of one statement, and how long it waits first.
func (n *NemesisDB) choose(sql string) (f fault, delay, wait time.Duration) {
	kind := StatementKind(sql)
	n.mu.Lock()
	defer n.mu.Unlock()
	wait = n.slow
	switch {
	case n.closed:
	case n.lose[kind] > 0 && n.rnd.Float64() < n.lose[kind]:
		n.counts["lost "+kind]++
		return loseReply, 0, wait
	case n.late[kind] > 0 && n.rnd.Float64() < n.late[kind]:
		n.counts["late "+kind]++
		return sendLate, n.from + time.Duration(n.rnd.Int63n(int64(n.to-n.from)+1)), wait
	}
	return pass, 0, wait
}

// hold waits d before a statement is sent, or fails it unsent when ctx
// ends first.
func hold(ctx context.Context, d time.Duration) error {
	if d <= 0 {
		return nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// later runs the statement after delay (or at cleanup), on a context of
// its own: its sender has given up.
func (n *NemesisDB) later(ctx context.Context, delay time.Duration, run func(context.Context)) {
	n.pending.Add(1)
	go func() {
		defer n.pending.Done()
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-n.flushed:
		}
		lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), lateTimeout)
		defer cancel()
		run(lctx)
	}()
}

// drainRows reads rows to their end, so that the statement has run.
func drainRows(rows pgx.Rows, err error) error {
	if err != nil {
		return err
	}
	for rows.Next() {
	}
	rows.Close()
	return rows.Err()
}

// Begin implements pglease.DB; transactions pass through.
func (n *NemesisDB) Begin(ctx context.Context) (pgx.Tx, error) { return n.db.Begin(ctx) }

// Exec implements pglease.DB.
func (n *NemesisDB) Exec(ctx context.Context, sql string, args ...any) (pgconn.CommandTag, error) {
	f, delay, wait := n.choose(sql)
	if err := hold(ctx, wait); err != nil {
		return pgconn.CommandTag{}, err
	}
	switch f {
	case loseReply:
		if _, err := n.db.Exec(ctx, sql, args...); err != nil {
			return pgconn.CommandTag{}, err
		}
		return pgconn.CommandTag{}, ErrReplyLost
	case sendLate:
		n.later(ctx, delay, func(lctx context.Context) { _, _ = n.db.Exec(lctx, sql, args...) })
		return pgconn.CommandTag{}, errGaveUp
	}
	return n.db.Exec(ctx, sql, args...)
}

// Query implements pglease.DB.
func (n *NemesisDB) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	f, delay, wait := n.choose(sql)
	if err := hold(ctx, wait); err != nil {
		return nil, err
	}
	switch f {
	case loseReply:
		if err := drainRows(n.db.Query(ctx, sql, args...)); err != nil {
			return nil, err
		}
		return nil, ErrReplyLost
	case sendLate:
		n.later(ctx, delay, func(lctx context.Context) { _ = drainRows(n.db.Query(lctx, sql, args...)) })
		return nil, errGaveUp
	}
	return n.db.Query(ctx, sql, args...)
}

// QueryRow implements pglease.DB. A statement whose reply is lost, or
// that is sent late, runs as a Query: the same statement, its rows read
// and dropped.
func (n *NemesisDB) QueryRow(ctx context.Context, sql string, args ...any) pgx.Row {
	f, delay, wait := n.choose(sql)
	if err := hold(ctx, wait); err != nil {
		return driver.ErrRow{Err: err}
	}
	switch f {
	case loseReply:
		if err := drainRows(n.db.Query(ctx, sql, args...)); err != nil {
			return driver.ErrRow{Err: err}
		}
		return driver.ErrRow{Err: ErrReplyLost}
	case sendLate:
		n.later(ctx, delay, func(lctx context.Context) { _ = drainRows(n.db.Query(lctx, sql, args...)) })
		return driver.ErrRow{Err: errGaveUp}
	}
	return n.db.QueryRow(ctx, sql, args...)
}

// HoldConnections takes every connection of pool, as jobs that keep them
// all would, within ctx; release gives them back. Connections that could
// not be taken in time are reported by the count.
func HoldConnections(ctx context.Context, pool *pgxpool.Pool) (release func(), held int) {
	var conns []*pgxpool.Conn
	for range pool.Config().MaxConns {
		c, err := pool.Acquire(ctx)
		if err != nil {
			break
		}
		conns = append(conns, c)
	}
	return func() {
		for _, c := range conns {
			c.Release()
		}
	}, len(conns)
}

// activeSQL counts the backends of application app that are running a
// statement or are inside a transaction, other than the one asking.
const activeSQL = `SELECT count(*) FROM pg_stat_activity
 WHERE application_name = $1 AND pid <> pg_backend_pid() AND state IS DISTINCT FROM 'idle'`

// WaitQuiet waits until no backend of application app runs a statement
// or has a transaction open, polling db, within ctx: every statement sent
// on those connections before the call has then run or failed for good.
func WaitQuiet(ctx context.Context, db pglease.DB, app string) error {
	for {
		var n int
		err := db.QueryRow(ctx, activeSQL, app).Scan(&n)
		if err == nil && n == 0 {
			return nil
		}
		t := time.NewTimer(10 * time.Millisecond)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("pgtest: backends of %s still busy (%d): %w", app, n, errors.Join(err, ctx.Err()))
		}
	}
}

// standbyWaitersSQL counts the backends whose commit waits for a synchronous
// standby.
const standbyWaitersSQL = `SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'`

// StandbyOutage is what WithoutStandby saw.
type StandbyOutage struct {
	// Waiting is the most backends seen waiting for the standby at once
	// (sampled every 50ms).
	Waiting int
	// From is when a commit was first seen waiting (zero if none was):
	// from then on every synchronous commit waits. Until is when the
	// standby was named no more: no wait ended so before it.
	From, Until time.Time
}

// WithoutStandby makes every synchronous commit on db's server wait for a
// synchronous standby that never answers (synchronous_standby_names names
// one that never connects, reloaded), for d, and then names none again,
// which ends every such wait. A commit whose wait is cancelled meanwhile
// (its client sent a cancel request) is committed on the server alone,
// and reported as a success with a WARNING. db must commit nothing
// synchronously itself meanwhile.
func WithoutStandby(ctx context.Context, db pglease.DB, d time.Duration) (o StandbyOutage, err error) {
	if _, err := db.Exec(ctx, `ALTER SYSTEM SET synchronous_standby_names = 'pgtest_unanswered'`); err != nil {
		return o, fmt.Errorf("pgtest: naming a synchronous standby: %w", err)
	}
	defer func() {
		o.Until = time.Now()
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer cancel()
		_, rerr := db.Exec(rctx, `ALTER SYSTEM RESET synchronous_standby_names`)
		if rerr == nil {
			_, rerr = db.Exec(rctx, `SELECT pg_reload_conf()`)
		}
		if rerr != nil {
			err = errors.Join(err, fmt.Errorf("pgtest: naming no synchronous standby again: %w", rerr))
		}
	}()
	if _, err := db.Exec(ctx, `SELECT pg_reload_conf()`); err != nil {
		return o, fmt.Errorf("pgtest: reloading the configuration: %w", err)
	}
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		var n int
		if err := db.QueryRow(ctx, standbyWaitersSQL).Scan(&n); err != nil {
			return o, fmt.Errorf("pgtest: counting the commits waiting for a standby: %w", err)
		}
		if n > 0 && o.From.IsZero() {
			o.From = time.Now()
		}
		o.Waiting = max(o.Waiting, n)
		t := time.NewTimer(min(50*time.Millisecond, max(0, time.Until(end))))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return o, ctx.Err()
		}
	}
	return o, nil
}
