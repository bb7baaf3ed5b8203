package pglease

import (
	"context"
	"errors"

	"github.com/pglease/pglease/internal/listen"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// channel is the channel the release statement notifies the released keys
// on: "pglease:" and the table's name as given to WithTable, cut to fit
// (sqlstmt.Channel). Lockers wake each other only if they name the table
// the same way ("lease" and "public.lease" are two channels); a waiter
// that misses a notification still wakes at its backoff and at the
// holder's expiry.
func (t table) channel() string { return sqlstmt.Channel(t.String()) }

// WaitMode says how a Locker's waiting claims learn that a key was
// released.
type WaitMode int

const (
	// WaitIdle means no claim of the Locker has waited yet.
	WaitIdle WaitMode = iota
	// WaitByNotification means a connection of the Locker LISTENs on the table's
	// channel and the release statement notifies it: waiters wake within a
	// round trip of a release.
	WaitByNotification
	// WaitByPolling means waiters try again after a backoff (at most
	// maxPollBackoff) or at the holder's expiry, whichever comes first.
	WaitByPolling
)

func (m WaitMode) String() string {
	switch m {
	case WaitByNotification:
		return "notification"
	case WaitByPolling:
		return "polling"
	}
	return "idle"
}

// WaitMode says how this Locker's waiting claims wake up, and why when
// they poll.
func (l *Locker) WaitMode() (WaitMode, string) {
	w := &l.waits
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.mode, w.reason
}

// listen runs the Locker's listener until ctx ends (internal/listen): one
// connection of the pool, owned by the Locker from then on, LISTENing on
// the table's channel. If notifications do not arrive, waiters poll; after
// every (re)LISTEN each waiter tries once, since a release may have been
// notified while nobody listened.
func (l *Locker) listen(ctx context.Context, done chan struct{}) {
	defer close(done)
	ln := &listen.Listener{
		Pool:    l.conns.pool,
		Listen:  l.waits.table.render(sqlstmt.Listen),
		Probe:   sqlstmt.Probe,
		Channel: l.waits.table.channel(),
		Notify:  l.waits.wake,
		Ready: func(pid uint32) {
			l.waits.mu.Lock()
			l.waits.pid = pid
			l.waits.mu.Unlock()
			l.setWaitMode(WaitByNotification, "")
			l.waits.wakeAll()
		},
		Polling: func(reason error) { l.setWaitMode(WaitByPolling, reason.Error()) },
	}
	ln.Run(ctx)
}

// setWaitMode records how waiters wake and reports a change.
func (l *Locker) setWaitMode(m WaitMode, reason string) {
	w := &l.waits
	w.mu.Lock()
	changed := w.mode != m || w.reason != reason
	w.mode, w.reason = m, reason
	w.mu.Unlock()
	if !changed {
		return
	}
	if m == WaitByNotification {
		l.emit(Event{Kind: EventWaitByNotification})
		return
	}
	l.emit(Event{Kind: EventWaitByPolling, Err: errors.New(reason)})
}
