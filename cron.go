package pglease

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

// parseCron reads crontab, in UTC unless it names its zone (CRON_TZ= or
// TZ=), and returns it with its zone named, as the replicas and gocron must
// all read it, and its schedule. It refuses @every, a delay from each run
// rather than instants, and a crontab none of whose instants comes.
func parseCron(crontab string) (string, cron.Schedule, error) {
	tab := strings.TrimSpace(crontab)
	if !strings.HasPrefix(tab, "CRON_TZ=") && !strings.HasPrefix(tab, "TZ=") {
		tab = "CRON_TZ=UTC " + tab
	}
	s, err := cronParser.Parse(tab)
	if err != nil {
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

// instantsAround returns the last two instants of s at or before now and
// the first two after it: the instant of s nearest any time less than half
// the shortest gap between two instants of s from now is among them (the
// database server's clock, off from now by less than that).
func instantsAround(s cron.Schedule, now time.Time) ([]time.Time, error) {
	var before []time.Time
	// Back from now, twice as far each time, until two instants lie
	// between; robfig's Next looks at most five years ahead.
	for back := time.Minute; len(before) < 2; back *= 2 {
		if back > 10*366*24*time.Hour {
			break
		}
		before = before[:0]
		for t := s.Next(now.Add(-back)); !t.IsZero() && !t.After(now); t = s.Next(t) {
			before = append(before, t)
		}
	}
	prev := before[max(len(before)-2, 0):]
	around := append(make([]time.Time, 0, len(prev)+2), prev...)
	for t := now; len(around) < len(prev)+2; {
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
