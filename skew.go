package pglease

import (
	"context"
	"log/slog"
	"time"

	"github.com/pglease/pglease/internal/skew"
)

// Skew is a reading of how far this replica's wall clock is from the
// database's, from the server time that claims and heartbeats return:
// Offset = server time - (sent + round trip/2), within ± round trip/2. See
// docs/GUIDE.md, "Skew".
type Skew struct {
	// Offset is the server's clock minus this replica's wall clock:
	// positive when the server is ahead.
	Offset time.Duration
	// Uncertainty bounds the error: the true offset was within Offset ±
	// Uncertainty when the sample was taken (half its round trip).
	Uncertainty time.Duration
	// At is the local wall time of the sample; zero when there is no
	// reading.
	At time.Time
}

// skewWarnWithoutMinHold is the skew a Locker without min hold warns
// beyond. Nothing in the protocol depends on the wall clock (the database
// owns lease time, trust runs on the local clocks against themselves), but
// gocron fires its jobs by each replica's wall clock: a replica a second
// off the database fires a second off the others, and a replica that far
// off is off NTP, which an operator wants to know.
const skewWarnWithoutMinHold = time.Second

// ClockSkew returns the Locker's latest reading of its wall clock's skew
// against the database's, and false before its first successful claim.
func (l *Locker) ClockSkew() (Skew, bool) {
	s, ok := l.skew.Get()
	return Skew(s), ok
}

// skewBound is the skew beyond which the Locker warns: half the shortest
// min hold of the Locker and its jobs (Locker.Job).
// The min hold keeps a replica whose timer fires later from running the
// tick again only while it fires less than the min hold after the holder;
// timers fire by each replica's wall clock, so two replicas' clocks must
// differ by less than it. Each replica can only measure its own clock
// against the database's, and two skews of half the min hold each, in
// opposite directions, already add up to it: half is the most each may
// show. Without min hold, skewWarnWithoutMinHold.
func (l *Locker) skewBound() time.Duration {
	if hold := time.Duration(l.minHold.Load()); hold > 0 {
		return hold / 2
	}
	return skewWarnWithoutMinHold
}

// recordSkew takes the sample of a claim or heartbeat round sent at sent (a time.Now() value)
// that returned the server time server after took, and returns the new
// reading. It logs a warning when the reading goes beyond skewBound, once
// per crossing, and at info level when it comes back within.
func (l *Locker) recordSkew(server, sent time.Time, took time.Duration) Skew {
	bound := l.skewBound()
	reading, up, down := l.skew.Add(skew.Measure(server, l.clock.Wall(sent), took), bound)
	if up || down {
		lvl, msg := slog.LevelWarn, "pglease: clock skew against the database beyond the bound"
		if down {
			lvl, msg = slog.LevelInfo, "pglease: clock skew against the database back within the bound"
		}
		l.cfg.logger.LogAttrs(context.Background(), lvl, msg,
			slog.String("holder", l.cfg.holder),
			slog.Duration("skew", reading.Offset),
			slog.Duration("uncertainty", reading.Uncertainty),
			slog.Duration("bound", bound),
			slog.Duration("min_hold", time.Duration(l.minHold.Load())),
			slog.String("why", "the min hold keeps a later-firing replica from running the same tick only while the replicas' clocks differ by less than it; each replica's skew must stay below half of it (1s without min hold); check NTP on this host"))
	}
	return Skew(reading)
}
