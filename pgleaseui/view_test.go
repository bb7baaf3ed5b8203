package pgleaseui

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
)

// TestStateOf pins the state a row shows: the rule of `pglease status`.
func TestStateOf(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	for _, c := range []struct {
		name string
		row  pglease.LeaseInfo
		want string
	}{
		{"LiveUnreleased", pglease.LeaseInfo{Holder: "a", Live: true}, "live"},
		{"ReleasedWhileAMinHoldKeepsItLive", pglease.LeaseInfo{Holder: "a", Live: true, ReleasedAt: now}, "released"},
		{"ReleasedAndExpired", pglease.LeaseInfo{Holder: "a", ReleasedAt: now}, "released"},
		{"ExpiredWithoutARelease", pglease.LeaseInfo{Holder: "a"}, "lapsed"},
		{"RevokedWhileLive", pglease.LeaseInfo{Holder: "pglease:revoked", Revoked: true, Live: true}, "revoked"},
		{"RevokedAndExpired", pglease.LeaseInfo{Holder: "pglease:revoked", Revoked: true}, "revoked"},
	} {
		t.Run(c.name, func(t *testing.T) { assert.Equal(t, c.want, stateOf(c.row)) })
	}
}

// TestShort pins how the page writes a period or a window.
func TestShort(t *testing.T) {
	for d, want := range map[time.Duration]string{time.Hour: "1h", 10 * time.Minute: "10m", 90 * time.Second: "1m30s", 2 * time.Second: "2s", 90 * time.Minute: "1h30m", 1500 * time.Millisecond: "1.5s"} {
		assert.Equal(t, want, short(d), "%v", d)
	}
}

// TestSkewText pins how a clock-skew reading is written: its sign is the
// rounded offset's, so an offset under 50µs reads as zero, unsigned.
func TestSkewText(t *testing.T) {
	ms := time.Millisecond
	for _, c := range []struct {
		offset, uncertainty time.Duration
		want                string
	}{
		{1230 * time.Microsecond, 2 * ms, "+1.2ms ± 2ms"},
		{-1230 * time.Microsecond, 2 * ms, "-1.2ms ± 2ms"},
		{-17 * time.Microsecond, 1738 * time.Microsecond, "0s ± 1.7ms"},
		{49 * time.Microsecond, 100 * time.Microsecond, "0s ± 100µs"},
		{50 * time.Microsecond, 100 * time.Microsecond, "+100µs ± 100µs"},
		{-3 * time.Second, 0, "-3s ± 0s"},
	} {
		assert.Equal(t, c.want, skewText(pglease.Skew{Offset: c.offset, Uncertainty: c.uncertainty}), "%v ± %v", c.offset, c.uncertainty)
	}
}

// TestJobOf pins the timeline of one job's runs: the gaps between its
// ticks, a tick run again after a lapse (caught up) and one run twice
// (doubled).
func TestJobOf(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	const period = 10 * time.Second
	run := func(tick int, fence int64, outcome string) pglease.Run {
		at := t0.Add(time.Duration(tick) * period)
		return pglease.Run{Key: "job", Tick: at, Fence: fence, Holder: "h", StartedAt: at, EndedAt: at.Add(time.Second), Outcome: outcome}
	}
	describe := func(j jobRow) []string {
		var out []string
		for _, e := range j.Entries {
			if e.Skipped > 0 {
				out = append(out, "gap "+time.Duration(e.Skipped).String())
				continue
			}
			out = append(out, e.Tick+" "+e.Outcome+" "+e.Note)
		}
		return out
	}
	t.Run("GapsCountTheTicksOfThePeriodWithNoRun", func(t *testing.T) {
		j := jobOf([]pglease.Run{run(0, 1, "completed"), run(1, 2, "completed"), run(4, 3, "completed")}, time.Time{})
		assert.Equal(t, "10s", j.Period)
		assert.Equal(t, 2, j.Skipped)
		assert.Equal(t, []string{"10:00:00 completed ", "10:00:10 completed ", "gap 2ns", "10:00:40 completed "}, describe(j))
	})
	t.Run("ATickTheLedgerSaysSkippedIsAGapWithTheTicksBeforeIt", func(t *testing.T) {
		j := jobOf([]pglease.Run{run(0, 1, "completed"), run(2, 5, "skipped"), run(3, 6, "skipped"), run(4, 7, "completed")}, time.Time{})
		assert.Equal(t, 3, j.Skipped)
		assert.Equal(t, []string{"10:00:00 completed ", "gap 3ns", "10:00:40 completed "}, describe(j))
	})
	t.Run("ATickRunAgainAfterALapseIsCaughtUp", func(t *testing.T) {
		j := jobOf([]pglease.Run{run(0, 1, "completed"), run(1, 2, "lapsed"), run(1, 3, "completed")}, time.Time{})
		assert.Zero(t, j.Doubled)
		assert.Equal(t, 1, j.Lapsed)
		assert.Equal(t, []string{"10:00:00 completed ", "10:00:10 lapsed ", "10:00:10 completed caught up"}, describe(j))
		assert.Contains(t, j.Entries[2].Class, "caught-up")
	})
	t.Run("ATickRunTwiceIsDoubled", func(t *testing.T) {
		j := jobOf([]pglease.Run{run(0, 1, "completed"), run(0, 2, "completed"), run(1, 3, "lapsed"), run(1, 4, "completed"), run(1, 5, "completed")}, time.Time{})
		assert.Equal(t, 2, j.Doubled)
		require.Len(t, j.Entries, 5)
		assert.Equal(t, "doubled", j.Entries[1].Note)
		assert.Equal(t, "caught up", j.Entries[3].Note)
		assert.Equal(t, "doubled", j.Entries[4].Note)
		assert.Contains(t, j.Entries[4].Class, "doubled")
	})
	t.Run("AFailedRunIsCountedAndNotRedone", func(t *testing.T) {
		j := jobOf([]pglease.Run{run(0, 1, "failed"), run(0, 2, "completed"), run(1, 3, "failed")}, time.Time{})
		assert.Equal(t, 2, j.Failed)
		assert.Equal(t, 1, j.Doubled, "a tick run again after a failed run of it is doubled, not caught up")
		assert.Equal(t, "doubled", j.Entries[1].Note)
		assert.Contains(t, j.Entries[0].Class, "outcome-failed")
	})
	t.Run("ARunningRunTookSoFarByTheServersClock", func(t *testing.T) {
		r := run(0, 1, "running")
		r.EndedAt = time.Time{}
		j := jobOf([]pglease.Run{r}, r.StartedAt.Add(2500*time.Millisecond))
		assert.Equal(t, "2.5s so far", j.Entries[0].Took)
		assert.Empty(t, j.Period, "one tick says no period")
	})
}

// TestBuild pins what the page makes of one reading: each job's latest
// runs only, and the holders with their live leases and all their runs.
func TestBuild(t *testing.T) {
	now := time.Date(2026, 12, 2, 10, 0, 0, 0, time.UTC)
	listed := []pglease.LeaseInfo{
		{Key: "a", Holder: "h1", Fence: 3, Live: true, ExpiresAt: now.Add(time.Second), ServerNow: now},
		{Key: "b", Holder: "h2", Fence: 4, ExpiresAt: now.Add(-time.Second), ServerNow: now},
		{Key: "c", Holder: "pglease:revoked", Revoked: true, Fence: 5, Live: true, ExpiresAt: now.Add(time.Second), ServerNow: now},
	}
	var runs []pglease.Run
	for i := range 3 {
		at := now.Add(time.Duration(i-3) * time.Minute)
		runs = append(runs, pglease.Run{Key: "job", Tick: at, Fence: int64(i + 1), Holder: "h2", StartedAt: at, EndedAt: at.Add(time.Second), Outcome: "completed"})
	}
	v := build(listed, runs, 2)

	t.Run("KeepsTheLatestRunsOfEachJob", func(t *testing.T) {
		require.Len(t, v.Jobs, 1)
		require.Len(t, v.Jobs[0].Entries, 2)
		assert.Equal(t, "09:58:00", v.Jobs[0].Entries[0].Tick)
		assert.Equal(t, "09:59:00", v.Jobs[0].Entries[1].Tick)
	})
	t.Run("HoldersAreTheLiveLeasesAndEveryRun", func(t *testing.T) {
		assert.Equal(t, []holderRow{
			{Holder: "h1", Leases: []string{"a"}},
			{Holder: "h2", Runs: 3, LastRun: "09:59:00"},
		}, v.Holders, "a revoked lease is nobody's")
	})
	t.Run("KeysWithTimeLeftByTheServersClock", func(t *testing.T) {
		require.Len(t, v.Keys, 3)
		assert.Equal(t, keyRow{Key: "a", Holder: "h1", Fence: "3", Left: "1s", State: "live", Live: true}, v.Keys[0])
		assert.Equal(t, "expired 1s ago", v.Keys[1].Left)
		assert.False(t, v.Keys[2].Live, "no button for a revoked lease")
		assert.Equal(t, "2026-12-02 10:00:00.0Z", v.ServerNow)
	})
}
