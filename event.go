package pglease

import (
	"context"
	"log/slog"
	"time"
)

// EventKind says what happened to a lease. A lease's events come in order:
// its claim, its heartbeats, its end. See docs/GUIDE.md, "Events".
type EventKind int

// The events a Locker reports through WithHook and WithLogger, with the
// level it logs them at.
const (
	EventAcquired           EventKind = iota + 1 // a claim returned a lease (debug)
	EventContended                               // a claim found another holder's live lease: ErrHeld (debug)
	EventClaimFailed                             // a claim failed for any other reason (error)
	EventExtended                                // a heartbeat extended Leases leases; Key is empty (debug)
	EventHeartbeatFailed                         // a heartbeat failed and is retried while leases are trusted (warn)
	EventLost                                    // a lease ended unreleased: taken, lapsed, untrusted or revoked (error)
	EventReleased                                // Unlock or Close released a lease (debug)
	EventReleaseFailed                           // a release failed; Err wraps ErrLost if a later lease had the key (error)
	EventElected                                 // an Elector's replica became the leader, with Fence (info)
	EventWaitByNotification                      // waiting claims wake by notification (info)
	EventWaitByPolling                           // waiting claims poll; Err says why and what fixes it (warn)
	EventStoppedLeading                          // an Elector's leadership lease ended, with Fence (info)
	EventNewLeader                               // an Elector saw a new leader, Holder (info)
	EventUnnamedJob                              // Lock got a key like a Go function name; Err says why to name it (error)
	EventRunWithoutLease                         // a Task's run found no lease of its job, and was skipped; once per job (warn)
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
	EventRunWithoutLease:    "run_without_lease",
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
	Key    string        // empty for heartbeats
	Holder string        // the Locker's holder; for a lease, its holder column (see WithoutFenceColumn)
	Fence  int64         // 0 when no lease was issued
	Err    error         // the cause, for failures and losses
	Took   time.Duration // the round trip of the claim, heartbeat or release
	Leases int           // heartbeats: the leases in the statement
	Skew   Skew          // EventAcquired, EventExtended: the Locker's ClockSkew reading

	// Tick is the tick claimed (EventAcquired) or refused (EventContended;
	// zero when this Locker's own run refused it, before any statement);
	// CaughtUp: a rerun of a lapsed tick; Skipped: refused while an earlier
	// tick's run held the key.
	Tick     time.Time
	CaughtUp bool
	Skipped  bool

	// Context is the context of the claim or release reported, or nil; a
	// hook may read its values but must not wait on it.
	Context context.Context
}

func (k EventKind) level() slog.Level {
	switch k {
	case EventClaimFailed, EventLost, EventReleaseFailed, EventUnnamedJob:
		return slog.LevelError
	case EventHeartbeatFailed, EventWaitByPolling, EventRunWithoutLease:
		return slog.LevelWarn
	case EventElected, EventWaitByNotification, EventStoppedLeading, EventNewLeader:
		return slog.LevelInfo
	default:
		return slog.LevelDebug
	}
}

// emit logs e and hands it to every hook of the Locker configured so.
func (c *config) emit(e Event) {
	if e.Holder == "" {
		e.Holder = c.holder
	}
	lvl := e.Kind.level()
	switch {
	case e.CaughtUp:
		lvl = slog.LevelWarn // a run lapsed: its replica died or was cut off mid-run
	case e.Skipped:
		lvl = slog.LevelInfo // a run outlasted its period
	}
	if log := c.logger; log.Enabled(context.Background(), lvl) {
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
		if !e.Tick.IsZero() {
			attrs = append(attrs, slog.Time("tick", e.Tick))
		}
		if e.CaughtUp {
			attrs = append(attrs, slog.Bool("caught_up", true))
		}
		if e.Err != nil {
			attrs = append(attrs, slog.Any("error", e.Err))
		}
		log.LogAttrs(context.Background(), lvl, "pglease: "+e.Kind.String(), attrs...)
	}
	for _, h := range c.hooks {
		h(e)
	}
}

// durationAttr is d as a slog attribute that reads the same under every
// handler: a time.Duration string ("1.234ms", "2.5s"), rounded to the
// microsecond below a second and to the millisecond above it.
// slog.Duration would be a count of nanoseconds under a JSON handler
// ("took":1234567), which a reader of the log must divide in their head.
func durationAttr(key string, d time.Duration) slog.Attr {
	switch {
	case d >= time.Second || d <= -time.Second:
		d = d.Round(time.Millisecond)
	case d >= time.Microsecond || d <= -time.Microsecond:
		d = d.Round(time.Microsecond)
	}
	return slog.String(key, d.String())
}
