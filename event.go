package pglease

import (
	"context"
	"log/slog"
	"time"
)

// EventKind says what happened to a lease.
//
// A Locker reports each lease's life in this order, to every hook of
// WithHook and to the logger of WithLogger:
//
//   - The claim: EventAcquired when it returned a lease, EventContended when
//     another holder's lease was live (ErrHeld), or EventClaimFailed. Only
//     EventAcquired begins a lease; it is reported before the lease is
//     visible to the heartbeat and to Close, so nothing about a lease is ever
//     reported before its EventAcquired. A claim that returned a row but no
//     lease (the row expired while the claim waited, or the reply came after
//     the lease's trust deadline) is EventClaimFailed with that row's Fence,
//     and nothing follows it. A claim that Close overtook after its
//     EventAcquired reports its lease's end like any other (below).
//   - While held: EventExtended for every heartbeat round that extended
//     leases, EventHeartbeatFailed for a round that failed and will be
//     retried until each lease's trust deadline. Both cover all the leases
//     of the Locker at once: Key is empty.
//   - The end, once per lease: EventReleased (Unlock or Close released it),
//     EventReleaseFailed (the release failed, or found a later lease of the
//     key: Err wraps ErrLost) or EventLost (a later claim took the key, it
//     lapsed, or its trust deadline passed). A lease lost before its Unlock
//     or Close reports EventLost, then EventReleaseFailed wrapping that loss;
//     one lost while its release is in flight reports EventLost, then
//     EventReleaseFailed only if the release statement failed or found
//     the row gone. These are the only leases with two end events.
//
// An Elector's leadership lease goes the same way, with EventElected right
// after its EventAcquired when this replica becomes the leader, and
// EventStoppedLeading after its end event. EventNewLeader reports a leader
// an Elector saw, its own included, once per change.
//
// Two events are about the Locker rather than a lease: EventWaitByNotification
// and EventWaitByPolling say how its waiting claims (ClaimWait, an
// Elector's campaign) wake, at their first use and at every change.
type EventKind int

// The events a Locker reports through WithHook and WithLogger.
const (
	// EventAcquired: a claim returned a lease. Logged at debug level.
	EventAcquired EventKind = iota + 1
	// EventContended: a claim found another holder's live lease (ErrHeld).
	// Normal between replicas; logged at debug level.
	EventContended
	// EventClaimFailed: a claim failed for any other reason (database down,
	// timeout, lease expired while the claim waited, Locker closed). Logged
	// at error level: without it a database outage silently stops every job.
	EventClaimFailed
	// EventExtended: a heartbeat round extended Leases leases. Key is empty.
	// Logged at debug level.
	EventExtended
	// EventHeartbeatFailed: a heartbeat round failed and will be retried
	// until each lease's trust deadline. Key is empty. Logged at warn level.
	EventHeartbeatFailed
	// EventLost: a lease ended without being released: a later claim took
	// the key, it lapsed, its trust deadline passed while the database
	// could not be reached, or an operator revoked it (Err then wraps
	// ErrRevoked as well as ErrLost). Logged at error level.
	EventLost
	// EventReleased: Unlock or Close released a lease. Logged at debug level.
	EventReleased
	// EventReleaseFailed: Unlock or Close could not release a lease; Err wraps
	// ErrLost when a later lease owned the key, and ErrRevoked too when an
	// operator had revoked it. Logged at error level, because gocron ignores
	// what Unlock returns.
	EventReleaseFailed
	// EventElected: an Elector's replica became the leader, with Fence the
	// fence of its leadership lease. Logged at info level. Its end is reported
	// as EventLost or EventReleased like any lease.
	EventElected
	// EventWaitByNotification: the Locker's waiting claims wake by
	// notification: its LISTEN works. Logged at info level.
	EventWaitByNotification
	// EventWaitByPolling: the Locker's waiting claims poll; Err says why
	// (the DB is not a pool, a pooler drops notifications, the listening
	// connection failed) and what fixes it (WithListenDSN); each waiting
	// key is then tried at most about once per maxPollInterval. Logged at
	// warn level.
	EventWaitByPolling
	// EventStoppedLeading: an Elector's leadership lease ended (resigned by
	// Close, or lost), with Fence the fence of that lease. Logged at info
	// level.
	EventStoppedLeading
	// EventNewLeader: an Elector saw a new leader, Holder (this replica's
	// own holder when it was elected). Logged at info level.
	EventNewLeader
	// EventUnnamedJob: Lock was given a key that looks like a Go function
	// name, gocron's default name of a job given no gocron.WithName; Err is
	// ErrUnnamedJob. Reported once per key, at error level.
	EventUnnamedJob
)

var eventNames = map[EventKind]string{
	EventAcquired:        "acquired",
	EventContended:       "contended",
	EventClaimFailed:     "claim_failed",
	EventExtended:        "extended",
	EventHeartbeatFailed: "heartbeat_failed",
	EventLost:            "lost",
	EventReleased:        "released",
	EventReleaseFailed:   "release_failed",
	EventElected:         "elected",

	EventWaitByNotification: "wait_by_notification",
	EventWaitByPolling:      "wait_by_polling",
	EventStoppedLeading:     "stopped_leading",
	EventNewLeader:          "new_leader",
	EventUnnamedJob:         "unnamed_job",
}

// String is a short snake_case name, usable as a metric label.
func (k EventKind) String() string {
	if s, ok := eventNames[k]; ok {
		return s
	}
	return "unknown"
}

// Event is one report from a Locker, given to every hook of WithHook.
type Event struct {
	Kind   EventKind
	Key    string        // empty for heartbeat rounds
	Holder string        // the Locker's holder; for a lease, its holder column (see WithoutFenceColumn)
	Fence  int64         // 0 when no lease was issued
	Err    error         // the cause, for failures and losses
	Took   time.Duration // the round trip of the claim, heartbeat or release
	Leases int           // heartbeat rounds: leases in the round
	Skew   Skew          // EventAcquired, EventExtended: the Locker's clock-skew reading after this claim or round (see ClockSkew); zero otherwise

	// Context is the context of the call the event reports, where there
	// is one: the claim's (Claim, ClaimWait, a job's lock, an Elector's
	// campaign) for EventAcquired, EventContended and EventClaimFailed;
	// the release's (Unlock, a job's unlock, Close) for EventReleased and
	// EventReleaseFailed. It is nil for the Locker's own rounds and
	// losses. A hook may read its values (the caller's trace span, a
	// request id) but must not wait on it: it may have ended.
	Context context.Context
}

func (k EventKind) level() slog.Level {
	switch k {
	case EventClaimFailed, EventLost, EventReleaseFailed, EventUnnamedJob:
		return slog.LevelError
	case EventHeartbeatFailed, EventWaitByPolling:
		return slog.LevelWarn
	case EventElected, EventWaitByNotification, EventStoppedLeading, EventNewLeader:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

// emit logs e and hands it to every hook.
func (l *Locker) emit(e Event) {
	if e.Holder == "" {
		e.Holder = l.cfg.holder
	}
	lvl := e.Kind.level()
	if log := l.cfg.logger; log.Enabled(context.Background(), lvl) {
		attrs := []slog.Attr{
			slog.String("event", e.Kind.String()),
			slog.String("holder", e.Holder),
		}
		if e.Took > 0 {
			attrs = append(attrs, durationAttr("took", e.Took))
		}
		if e.Key != "" || e.Kind != EventExtended && e.Kind != EventHeartbeatFailed {
			attrs = append(attrs, slog.String("key", e.Key), slog.Int64("fence", e.Fence))
		} else {
			attrs = append(attrs, slog.Int("leases", e.Leases))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("error", e.Err))
		}
		log.LogAttrs(context.Background(), lvl, "pglease: "+e.Kind.String(), attrs...)
	}
	for _, h := range l.cfg.hooks {
		h(e)
	}
}

// durationAttr is d as a slog attribute that reads the same under every
// handler: a time.Duration string ("1.234ms", "2.5s"), rounded to the
// microsecond below a second and to the millisecond above it.
// slog.Duration would be a count of nanoseconds under a JSON handler
// ("took":1234567), which a reader of the log must divide in their head.
func durationAttr(key string, d time.Duration) slog.Attr {
	return slog.String(key, readableDuration(d))
}

func readableDuration(d time.Duration) string {
	switch {
	case d >= time.Second || d <= -time.Second:
		return d.Round(time.Millisecond).String()
	case d >= time.Microsecond || d <= -time.Microsecond:
		return d.Round(time.Microsecond).String()
	}
	return d.String()
}
