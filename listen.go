package pglease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/listen"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// channelOf is the channel the release statement notifies the released keys
// on: "pglease:" and the table's name as given to WithTable, cut to fit
// (sqlstmt.Channel). Lockers wake each other only if they name the table
// the same way ("lease" and "public.lease" are two channels); a waiter
// that misses a notification still wakes at its backoff and at the
// holder's expiry.
func channelOf(t driver.Table) string { return sqlstmt.Channel(t.String()) }

// waitMode says how a Locker's waiting claims learn that a key was
// released; EventWaitByNotification and EventWaitByPolling report each
// change.
type waitMode int

const (
	// waitIdle means no claim of the Locker has waited yet.
	waitIdle waitMode = iota
	// waitByNotification means a connection of the Locker LISTENs for
	// releases: waiters wake within a round trip of one.
	waitByNotification
	// waitByPolling means waiters try again about once a second, and at the
	// holder's expiry; WithListenDSN lets a Locker behind a pooler wait by
	// notification instead.
	waitByPolling
)

// maxPollInterval is the longest pause between two attempts of a waiting
// claim that polls (internal/poll says when it pauses less): a waiting key
// costs at most two statements a second, a claim and a read. At most 250ms
// would make each follower of an Elector behind PgBouncer send about 600
// statements a minute (docs/BENCHMARKS.md); a second keeps a handover
// within the one-second granularity of most schedules, at 120.
const maxPollInterval = time.Second

func (m waitMode) String() string {
	switch m {
	case waitByNotification:
		return "notification"
	case waitByPolling:
		return "polling"
	}
	return "idle"
}

// waitMode says how this Locker's waiting claims wake up, and why when
// they poll.
func (l *Locker) waitMode() (waitMode, string) {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode, w.reason
}

// listen runs the Locker's listener until ctx ends (internal/listen): one
// connection, owned by the Locker from then on (taken from the pool, or
// dialed with WithListenDSN), LISTENing on the table's channel. If
// notifications do not arrive, waiters poll; when they stop arriving, a
// waiter asleep on the notified safety net polls at once (setWaitMode).
// (Re)LISTEN wakes nobody: a waiter then asleep on a polling pause tries at
// its end, which sees any release notified while nobody listened, and a
// waiter that read the mode after LISTEN hears every release since.
func (l *Locker) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	ln := &listen.Listener{
		Source:  l.listenSource(),
		Listen:  l.waits.table.Render(sqlstmt.Listen),
		Probe:   sqlstmt.Probe,
		Channel: channelOf(l.waits.table),
		Notify:  l.waits.set.Wake,
		Ready: func(pid uint32) {
			l.waits.mu.Lock()
			l.waits.pid = pid
			l.waits.mu.Unlock()
			l.setWaitMode(waitByNotification, "")
		},
		Polling: func(reason error) { l.setWaitMode(waitByPolling, l.pollingReason(reason)) },
	}
	ln.Run(ctx)
}

// setWaitMode records how waiters wake and reports a change; the switch
// from notification to polling makes the waiters repoll.
func (l *Locker) setWaitMode(m waitMode, reason string) {
	w := &l.waits
	w.mu.Lock()
	changed := w.mode != m || w.reason != reason
	stopped := w.mode == waitByNotification && m == waitByPolling
	w.mode, w.reason = m, reason
	w.mu.Unlock()
	if stopped {
		w.set.RepollAll()
	}
	if !changed {
		return
	}
	if m == waitByNotification {
		l.cfg.emit(Event{Kind: EventWaitByNotification})
		return
	}
	l.cfg.emit(Event{Kind: EventWaitByPolling, Err: fmt.Errorf("%s; waiting claims poll, each waiting key tried about once per %v: a claim and a read", reason, maxPollInterval)})
}

// pollingReason is why waiters poll, as waitMode says it: the listener's
// reason, and what to do about it.
func (l *Locker) pollingReason(reason error) string {
	if cfg := l.cfg.listen; cfg != nil {
		return fmt.Sprintf("the connection of WithListenDSN (%s:%d): %v", cfg.Host, cfg.Port, reason)
	}
	if errors.Is(reason, listen.ErrNoDelivery) {
		return reason.Error() + "; WithListenDSN gives the Locker a direct connection to LISTEN on"
	}
	return reason.Error()
}

// WithListenDSN gives the Locker a connection of its own, dialed with dsn
// (as pgx.ParseConfig reads it), only to LISTEN for the releases its waiting
// claims wait for. Behind a transaction pooler, point dsn at the server
// itself. By default a Locker on a *pgxpool.Pool listens on one of its
// connections. See docs/GUIDE.md, "WithListenDSN".
func WithListenDSN(dsn string) Option {
	return Option{"WithListenDSN", atLocker, lockerWide, func(c *config) {
		if strings.TrimSpace(dsn) == "" {
			c.invalid("WithListenDSN", "WithListenDSN: dsn is empty: give the server's address, past the pooler")
			return
		}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			// pgx's error redacts the password.
			c.invalid("WithListenDSN", "WithListenDSN: dsn does not parse: %v", err)
			return
		}
		c.listen = cfg
	}}
}

// listenSource is where the listener takes its connection (WithListenDSN's,
// or the pool's: startListener checked), its probes sent as releases are.
func (l *Locker) listenSource() listen.Source {
	send := func(ctx context.Context, sql string, args ...any) error {
		_, err := l.conns.Release().Exec(ctx, sql, args...)
		return err
	}
	if cfg := l.cfg.listen; cfg != nil {
		return listen.DialSource{Config: cfg, Send: send}
	}
	return listen.PoolSource{Pool: l.conns.Pool(), Send: send}
}

// startListener starts the listener at the first waiting claim, on a pool
// only: a *pgx.Conn is shared with the heartbeat, and a wrapper may not be
// able to LISTEN, so those poll. With WithListenDSN the listener dials a
// connection of its own, whatever the DB.
func (l *Locker) startListener() {
	w := &l.waits
	w.mu.Lock()
	if w.closed || w.mode != waitIdle {
		w.mu.Unlock()
		return
	}
	if l.conns.Pool() == nil && l.cfg.listen == nil {
		w.mu.Unlock()
		l.setWaitMode(waitByPolling, fmt.Sprintf("the DB is a %T, not a *pgxpool.Pool: no connection of its own to LISTEN on (WithListenDSN gives it one)", l.conns.DB()))
		return
	}
	w.mode, w.reason = waitByPolling, "LISTEN not established yet"
	ctx, stop := context.WithCancel(context.Background())
	w.stop, w.done = stop, make(chan struct{})
	go l.listen(ctx, w.done)
	w.mu.Unlock()
}

// stopWaiting ends every waiting claim with ErrClosed and stops the
// listener; Close calls it first.
func (l *Locker) stopWaiting() {
	w := &l.waits
	w.set.Close()
	w.mu.Lock()
	w.closed = true
	stop, done := w.stop, w.done
	w.mu.Unlock()
	if stop != nil {
		stop()
		<-done
	}
}
