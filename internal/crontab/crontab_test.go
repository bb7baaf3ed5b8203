package crontab

import (
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestCron pins how a job's crontab (WithCron) is read and which of its
// instants a claim sends: no database needed.
func TestCron(t *testing.T) {
	t.Parallel()

	t.Run("ReadsGocronsSyntaxInUTCUnlessZoned", func(t *testing.T) {
		t.Parallel()
		for crontab, want := range map[string]string{
			"0 3 * * *":                          "CRON_TZ=UTC 0 3 * * *",
			"*/5 * * * * *":                      "CRON_TZ=UTC */5 * * * * *",
			"@daily":                             "CRON_TZ=UTC @daily",
			"CRON_TZ=America/New_York 0 3 * * *": "CRON_TZ=America/New_York 0 3 * * *",
		} {
			tab, s, err := Parse(crontab)
			require.NoError(t, err, crontab)
			assert.Equal(t, want, tab)
			from := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
			next := s.Next(from)
			switch crontab {
			case "0 3 * * *":
				assert.Equal(t, time.Date(2026, 12, 3, 3, 0, 0, 0, time.UTC), next.UTC())
			case "CRON_TZ=America/New_York 0 3 * * *":
				assert.Equal(t, time.Date(2026, 12, 3, 8, 0, 0, 0, time.UTC), next.UTC(), "3 am in New York, winter time")
			}
		}
	})

	t.Run("RefusesWhatHasNoInstants", func(t *testing.T) {
		t.Parallel()
		for crontab, why := range map[string]string{
			"@every 1m":                      "@every",
			"0 0 30 2 *":                     "none of its instants comes",
			"61 * * * *":                     "61",
			"* * * *":                        "expected",
			"CRON_TZ=Nowhere/Else 0 3 * * *": "Nowhere/Else",
			"CRON_TZ=Local 0 3 * * *":        "the zone Local is each host's own",
			"CRON_TZ=UTC":                    "a zone and no schedule",
			"TZ=Europe/Paris   ":             "a zone and no schedule",
			"":                               "",
		} {
			_, _, err := Parse(crontab)
			require.ErrorContains(t, err, why, crontab)
		}
	})

	// A crontab whose instants all lie in one month a year: the instants
	// before the clock are found in a few dozen steps, not by walking the
	// millions of that month.
	t.Run("FindsTheInstantsBeforeTheClockWithoutWalkingThem", func(t *testing.T) {
		t.Parallel()
		_, s, err := Parse("* * * * 1 *") // every second of January
		require.NoError(t, err)
		calls := 0
		counting := nextFunc(func(x time.Time) time.Time { calls++; return s.Next(x) })
		got, err := InstantsAround(counting, time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC))
		require.NoError(t, err)
		assert.Equal(t, []time.Time{
			time.Date(2026, 1, 31, 23, 59, 58, 0, time.UTC), time.Date(2026, 1, 31, 23, 59, 59, 0, time.UTC),
			time.Date(2027, 1, 1, 0, 0, 0, 0, time.UTC), time.Date(2027, 1, 1, 0, 0, 1, 0, time.UTC),
		}, utc(got))
		assert.Less(t, calls, 200, "calls of Next")
	})

	// Whatever the claimer's clock, the instant nearest any clock off from
	// it by less than half the shortest gap between two instants is among
	// those a claim sends.
	t.Run("SendsTheInstantNearestAnyClockWithinHalfTheShortestGap", func(t *testing.T) {
		t.Parallel()
		rng := rand.New(rand.NewPCG(1, 2))
		for crontab, gap := range map[string]time.Duration{
			"*/3,1-59/3 * * * * *": time.Second, // seconds 0, 1, 3, 4, ...: gaps of 1 and 2 s
			"0 0,10 * * * *":       10 * time.Minute,
			"0 9 * * 1-5":          24 * time.Hour,
			"@yearly":              365 * 24 * time.Hour,
		} {
			_, s, err := Parse(crontab)
			require.NoError(t, err)
			base := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
			for range 200 {
				now := base.Add(time.Duration(rng.Int64N(int64(3 * 365 * 24 * time.Hour))))
				server := now.Add(time.Duration((rng.Float64() - 0.5) * 0.999 * float64(gap)))
				sent, err := InstantsAround(s, now)
				require.NoError(t, err)
				want := nearestInstant(t, s.Next, server, 2*gap)
				assert.True(t, slices.ContainsFunc(sent, want.Equal), "%s: claimer at %v, server at %v: nearest %v not in %v", crontab, now, server, want, sent)
				assert.True(t, slices.IsSortedFunc(sent, time.Time.Compare), "in order: %v", sent)
			}
		}
	})
}

// nearestInstant is the instant of next's schedule nearest x, found by
// walking from back before it.
func nearestInstant(t *testing.T, next func(time.Time) time.Time, x time.Time, back time.Duration) time.Time {
	t.Helper()
	var before time.Time
	for at := next(x.Add(-back)); !at.After(x); at = next(at) {
		before = at
	}
	after := next(x)
	require.False(t, before.IsZero() && after.IsZero())
	if before.IsZero() || !after.IsZero() && after.Sub(x) <= x.Sub(before) {
		return after
	}
	return before
}

// nextFunc is a cron.Schedule of a function.
type nextFunc func(time.Time) time.Time

func (f nextFunc) Next(t time.Time) time.Time { return f(t) }

func utc(ts []time.Time) []time.Time {
	out := make([]time.Time, len(ts))
	for i, t := range ts {
		out[i] = t.UTC()
	}
	return out
}
