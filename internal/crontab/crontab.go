// Package crontab reads a job's crontab as gocron does and finds the
// instants of its schedule a claim of a tick sends: pure functions of a
// schedule and a clock.
package crontab

import (
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/robfig/cron/v3"
)

// cronParser reads a crontab as gocron's CronJob(crontab, true) does: five
// fields, or six with seconds first, or a descriptor.
var cronParser = cron.NewParser(cron.SecondOptional | cron.Minute | cron.Hour | cron.Dom | cron.Month | cron.Dow | cron.Descriptor)

// Parse reads crontab, in UTC unless it names its zone (CRON_TZ= or
// TZ=), and returns it with its zone named, as the replicas and gocron must
// all read it, and its schedule. It refuses @every, a delay from each run
// rather than instants; the zone Local, which differs from host to host
// and which gocron reads in its scheduler's location; and a crontab none
// of whose instants comes.
func Parse(crontab string) (tab string, s cron.Schedule, err error) {
	tab = strings.TrimSpace(crontab)
	if zone, rest, _ := strings.Cut(tab, " "); strings.HasPrefix(zone, "CRON_TZ=") || strings.HasPrefix(zone, "TZ=") {
		if _, name, _ := strings.Cut(zone, "="); name == "Local" {
			return "", nil, errors.New("the zone Local is each host's own: name the zone, as in CRON_TZ=Europe/Paris")
		}
		if strings.TrimSpace(rest) == "" {
			return "", nil, errors.New("a zone and no schedule")
		}
	} else {
		tab = "CRON_TZ=UTC " + tab
	}
	defer func() {
		if recover() != nil { // robfig/cron v3 slices some malformed crontabs out of range
			tab, s, err = "", nil, errors.New("malformed")
		}
	}()
	if s, err = cronParser.Parse(tab); err != nil {
		return "", nil, err
	}
	if _, every := s.(cron.ConstantDelaySchedule); every {
		return "", nil, errors.New("@every counts from each run, not from fixed instants: use WithPeriod")
	}
	if s.Next(time.Now()).IsZero() {
		return "", nil, errors.New("none of its instants comes")
	}
	return tab, s, nil
}

// InstantsAround returns the last two instants of s at or before now and
// the first two after it: the instant of s nearest any time less than half
// the shortest gap between two instants of s from now is among them (the
// database server's clock, off from now by less than that).
func InstantsAround(s cron.Schedule, now time.Time) ([]time.Time, error) {
	around := make([]time.Time, 0, 4)
	if prev := lastAtOrBefore(s, now); !prev.IsZero() {
		if prev2 := lastAtOrBefore(s, prev.Add(-time.Second)); !prev2.IsZero() {
			around = append(around, prev2)
		}
		around = append(around, prev)
	}
	for t := now; len(around) < cap(around); {
		if t = s.Next(t); t.IsZero() {
			break
		}
		around = append(around, t)
	}
	if len(around) == 0 {
		return nil, fmt.Errorf("no instant of the schedule within ten years of %v", now.UTC().Format(time.RFC3339))
	}
	return around, nil
}

// lastAtOrBefore is the last instant of s at or before t, within ten
// years (zero if none): the Next of the latest x with Next(x) <= t, found
// by going back from t twice as far each time, then by bisection, in a few
// dozen calls of Next whatever the crontab (s has only Next, and its
// instants are whole seconds).
func lastAtOrBefore(s cron.Schedule, t time.Time) time.Time {
	before := func(x time.Time) bool { n := s.Next(x); return !n.IsZero() && !n.After(t) }
	for back := time.Second; back <= 10*366*24*time.Hour; back *= 2 {
		lo := t.Add(-back)
		if !before(lo) {
			continue
		}
		for hi := t; hi.Sub(lo) > time.Second; { // before(lo), !before(hi)
			if mid := lo.Add(hi.Sub(lo) / 2); before(mid) {
				lo = mid
			} else {
				hi = mid
			}
		}
		return s.Next(lo)
	}
	return time.Time{}
}
