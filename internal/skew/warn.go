package skew

import (
	"context"
	"log/slog"
	"time"
)

// warnWithoutMinHold is the skew warned of beyond when no min hold is set.
// Nothing in the protocol depends on the wall clock (the database owns
// lease time, trust runs on the local clocks against themselves), but
// gocron fires its jobs by each replica's wall clock: a replica a second
// off the database fires a second off the others, and a replica that far
// off is off NTP, which an operator wants to know.
const warnWithoutMinHold = time.Second

// Bound is the skew beyond which a Locker warns: half minHold, the
// shortest min hold of the Locker and its jobs. The min hold keeps a
// replica whose timer fires later from running the tick again only while
// it fires less than the min hold after the holder; timers fire by each
// replica's wall clock, so two replicas' clocks must differ by less than
// it. Each replica measures only its own clock against the database's: two
// skews of half the min hold in opposite directions already add up to it.
// Without min hold, a second.
func Bound(minHold time.Duration) time.Duration {
	if minHold > 0 {
		return minHold / 2
	}
	return warnWithoutMinHold
}

// Warn logs a crossing of bound that Filter.Add reported (up or down) for
// holder's reading: a warning beyond it, and at info level back within.
func Warn(logger *slog.Logger, holder string, reading Sample, up, down bool, bound, minHold time.Duration) {
	if !up && !down {
		return
	}
	lvl, msg := slog.LevelWarn, "pglease: clock skew against the database beyond the bound"
	if down {
		lvl, msg = slog.LevelInfo, "pglease: clock skew against the database back within the bound"
	}
	logger.LogAttrs(context.Background(), lvl, msg,
		slog.String("holder", holder),
		slog.Duration("skew", reading.Offset),
		slog.Duration("uncertainty", reading.Uncertainty),
		slog.Duration("bound", bound),
		slog.Duration("min_hold", minHold),
		slog.String("why", "the min hold keeps a later-firing replica from running the same tick only while the replicas' clocks differ by less than it; each replica's skew must stay below half of it (1s without min hold); check NTP on this host"))
}
