package pglease_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestRuns pins the ledger of runs: each run of a job's tick entered once,
// closed with how it ended, and what catch-up may run again.
func TestRuns(t *testing.T) {
	t.Parallel()
	t.Run("AClaimOfUnknownOutcomeIsGivenBackAndItsTickRunOnce", testRunsAClaimOfUnknownOutcomeIsGivenBackAndItsTickRunOnce)
	t.Run("AReleaseRacingTheNextClaimIsCompleted", testRunsAReleaseRacingTheNextClaimIsCompleted)
	t.Run("NoRunWithoutALease", testRunsNoRunWithoutALease)
	t.Run("APlainClaimsLapseIsNoRunToCatchUp", testRunsAPlainClaimsLapseIsNoRunToCatchUp)
	t.Run("AReleasedRunHeldForItsMinHoldIsCompleted", testRunsAReleasedRunHeldForItsMinHoldIsCompleted)
	t.Run("PurgeKeepsTheRunHoldingTheKey", testRunsPurgeKeepsTheRunHoldingTheKey)
	t.Run("AClaimPastItsTrustWindowIsGivenBackAndItsTickRunOnce", testRunsAClaimPastItsTrustWindowIsGivenBackAndItsTickRunOnce)
	t.Run("ARunThatReturnsAnErrorIsFailedAndNotCaughtUp", testRunsARunThatReturnsAnErrorIsFailedAndNotCaughtUp)
	t.Run("ASkippedTickIsListedWhenItsOnlyClaimSinceWasGivenBack", testRunsASkippedTickIsListedWhenItsOnlyClaimSinceWasGivenBack)
}

// Guarantee: a run whose task (Locker.Task) returns an error is closed as
// failed in the ledger by its release, and gocron gets the error; one that
// returns nil is completed; a failed run was released, so catch-up does
// not run its tick again.
func testRunsARunThatReturnsAnErrorIsFailedAndNotCaughtUp(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = time.Second
	boom := errors.New("boom")
	gocronGot := make(chan error, 8)
	runs := 0
	var mu sync.Mutex
	for _, name := range []string{"a", "b"} {
		l := pgtest.Locker(t, pgtest.Pool(t, nil), table, name)
		j := mustJob(t, l, pglease.WithPeriod(period), pglease.WithCatchUp())
		s, err := gocron.NewScheduler()
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Shutdown() }) // before the Locker's Close
		task, named := l.Task("job", func(context.Context, *pglease.Lease) error {
			mu.Lock()
			defer mu.Unlock()
			runs++
			if runs%2 == 1 {
				return boom
			}
			return nil
		})
		_, err = j.Schedule(s, task, named, gocron.WithEventListeners(gocron.AfterJobRunsWithError(func(_ uuid.UUID, _ string, err error) {
			gocronGot <- err
		})))
		require.NoError(t, err)
		s.Start()
	}
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	var got []pglease.Run
	require.Eventually(t, func() bool {
		got, err = admin.Runs(ctx, "job", time.Hour)
		require.NoError(t, err)
		return len(got) >= 4 && got[3].Outcome != "running"
	}, 15*time.Second, 100*time.Millisecond, "four runs closed")
	mu.Lock()
	defer mu.Unlock()
	for i, r := range got[:4] {
		want := map[bool]string{true: "failed", false: "completed"}[i%2 == 0]
		assert.Equal(t, want, r.Outcome, "run %d (tick %v, fence %d)", i, r.Tick, r.Fence)
		if i > 0 {
			assert.True(t, r.Tick.After(got[i-1].Tick), "each tick once, none caught up: %+v", got)
		}
	}
	select {
	case err := <-gocronGot:
		require.ErrorIs(t, err, boom, "gocron gets the run's error")
	case <-time.After(5 * time.Second):
		t.Fatal("gocron got no error")
	}
}

// runOf returns the run of fence in runs, if listed.
func runOf(runs []pglease.Run, fence int64) (pglease.Run, bool) {
	for _, r := range runs {
		if r.Fence == fence {
			return r, true
		}
	}
	return pglease.Run{}, false
}

// Guarantee: a claim of a tick whose reply is lost is given back as a run
// that ran nothing ("given back"), not a completed one, and the tick is
// then run once, by a replica with catch-up: at least once while a replica
// lives.
func testRunsAClaimOfUnknownOutcomeIsGivenBackAndItsTickRunOnce(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period, ttl = 4 * time.Second, time.Second
	nem := pgtest.NewNemesisDB(t, pool, 1)
	a := mustJob(t, pgtest.Locker(t, nem, table, "a", pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	sleepToPhase(period, 0.05)
	nem.LoseReplies("claim", 1)
	_, err = a.Lock(ctx, "job")
	nem.Heal()
	require.Error(t, err, "a's claim reply was lost")
	require.NotErrorIs(t, err, pglease.ErrHeld)
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok, "the claim committed")
	require.False(t, row.Live, "and was given back")

	// b fires for the same tick: nobody ran it.
	lock, err := b.Lock(ctx, "job")
	if assert.NoError(t, err, "b finds a tick nobody ran: with catch-up it must run it (at least once per tick while a replica lives)") {
		_ = lock.Unlock(ctx)
	}
	runs, err := admin.Runs(ctx, "job", time.Hour)
	require.NoError(t, err)
	r, ok := runOf(runs, row.Fence)
	if ok {
		assert.NotEqual(t, "completed", r.Outcome,
			"the ledger says fence %d completed (released by its holder), but no lease was ever handed out for it: %+v", row.Fence, runs)
	}
}

// Guarantee: a run released by its holder is completed in the ledger even
// when its release commits late (a slow trigger here; a commit waiting on
// the notification queue's lock in life), after the next tick's claim read
// the row expired and unreleased, and waited on its lock: the release closes
// its own run.
func testRunsAReleaseRacingTheNextClaimIsCompleted(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period, ttl = 3 * time.Second, time.Second
	ident := pgx.Identifier{table}.Sanitize()
	fn := pgx.Identifier{table + "_slow"}.Sanitize()
	_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE FUNCTION %s() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  IF NEW.released_at IS NOT NULL AND OLD.released_at IS NULL THEN PERFORM pg_sleep(2.5); END IF;
  RETURN NEW;
END $$`, fn))
	require.NoError(t, err)
	_, err = pool.Exec(ctx, fmt.Sprintf(`CREATE TRIGGER slow_release AFTER UPDATE ON %s FOR EACH ROW EXECUTE FUNCTION %s()`, ident, fn))
	require.NoError(t, err)

	opts := []pglease.Option{pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(200 * time.Millisecond), pglease.WithTimeout(10 * time.Second)}
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", opts...), pglease.WithPeriod(period))
	// b's TTL outlasts its wait on the row lock: its claim hands out a lease.
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", opts...), pglease.WithPeriod(period), pglease.WithTTL(5*time.Second))
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	sleepToPhase(period, 0.05)
	first, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	unlocked := make(chan error, 1)
	go func() {
		time.Sleep(200 * time.Millisecond)
		unlocked <- first.Unlock(ctx) // its commit is 2.5s late
	}()
	// Just past half the period: the server rounds to the next tick; after
	// the old expiry (at most 1.35s past the tick) and before the release
	// commits (about 2.85s past it).
	time.Sleep(time.Until(first.Tick().Add(period/2 + 100*time.Millisecond)))
	next, err := b.Claim(ctx, "job")
	require.NoError(t, err, "b takes the next tick once the release commits")
	require.NoError(t, <-unlocked, "a released its lease")
	if next != nil {
		defer func() { _ = next.Unlock(ctx) }()
	}

	runs, err := admin.Runs(ctx, "job", time.Hour)
	require.NoError(t, err)
	r, ok := runOf(runs, first.Fence())
	require.True(t, ok, "%+v", runs)
	assert.Equal(t, "completed", r.Outcome, "a released its run (Unlock returned nil), the ledger says %q: %+v", r.Outcome, runs)
}

// Guarantee: the ledger holds one run per lease handed out for a tick: a
// claim that waited on the row's lock past its own TTL, and handed out
// nothing (ErrLost), enters no run.
func testRunsNoRunWithoutALease(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period, ttl = 3 * time.Second, time.Second
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl)), pglease.WithPeriod(period))
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl), pglease.WithTimeout(10*time.Second)), pglease.WithPeriod(period))
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	sleepToPhase(period, 0.05)
	first, err := a.Claim(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, first.Unlock(ctx))
	operator := pgtest.LockRows(t, pool, table, "key = $1", "job") // an operator looks at the row
	time.Sleep(time.Until(first.Tick().Add(period + 100*time.Millisecond)))
	type claimed struct {
		lease *pglease.Lease
		err   error
	}
	got := make(chan claimed, 1)
	go func() {
		lease, err := b.Claim(ctx, "job")
		got <- claimed{lease, err}
	}()
	// Counted from the claim's wait on the row, not from its call: on a
	// loaded machine the call may take a while to send it.
	pgtest.BlockedBy(t, pool, operator, 5*time.Second)
	time.Sleep(1500 * time.Millisecond) // past b's TTL
	require.NoError(t, operator.Rollback(ctx))
	c := <-got
	lease, err := c.lease, c.err
	if err == nil {
		_ = lease.Unlock(ctx)
		t.Skip("this driver's claim did not wait on the row lock past its TTL: the case does not arise")
	}
	require.ErrorIs(t, err, pglease.ErrLost, "b's claim expired while it waited: no lease")
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)
	t.Logf("b's claim: %v; row %+v", err, row)

	runs, err := admin.Runs(ctx, "job", time.Hour)
	require.NoError(t, err)
	r, listed := runOf(runs, row.Fence)
	assert.False(t, listed, "the ledger lists a run (fence %d, outcome %q) for which no lease was handed out: %+v", row.Fence, r.Outcome, runs)
}

// Guarantee: catch-up runs a tick again only after the lapse of a run of
// that tick: a plain claim of the key (which keeps the row's tick) that
// lapses after the tick's run completed is no run of it, and a replica with
// catch-up firing for the tick skips it.
func testRunsAPlainClaimsLapseIsNoRunToCatchUp(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period, ttl = 6 * time.Second, time.Second
	a := mustJob(t, pgtest.Locker(t, pool, table, "a", pglease.WithTTL(ttl)), pglease.WithPeriod(period))
	plainDB := pgtest.NewFaultyDB(pool)
	plain := pgtest.Locker(t, plainDB, table, "plain", pglease.WithTTL(ttl))
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", pglease.WithTTL(ttl)), pglease.WithPeriod(period), pglease.WithCatchUp())
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	sleepToPhase(period, 0.05)
	lock, err := a.Lock(ctx, "job")
	require.NoError(t, err)
	run := lock.(*pglease.Lease)
	require.NoError(t, run.Unlock(ctx), "tick T ran and completed")

	_, err = plain.Claim(ctx, "job")
	require.NoError(t, err, "a plain claim of the key")
	plainDB.Cut(errors.New("killed")) // its lease lapses without a release

	lock, err = b.Lock(ctx, "job") // waits for the lapse, then catches up
	if err == nil {
		caught := lock.(*pglease.Lease)
		_ = caught.Unlock(ctx)
		runs, _ := admin.Runs(ctx, "job", time.Hour)
		t.Errorf("tick %v ran twice: fence %d completed, and b caught it up with fence %d (tick %v); ledger %+v",
			run.Tick(), run.Fence(), caught.Fence(), caught.Tick(), runs)
		return
	}
	assert.ErrorIs(t, err, pglease.ErrHeld)
}

// Guarantee: Admin.Runs tells a run released by its holder (completed, with
// its end) from one still running, though a min hold keeps the released
// lease live.
func testRunsAReleasedRunHeldForItsMinHoldIsCompleted(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	j := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(time.Hour), pglease.WithMinHold(30*time.Second))
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	lock, err := j.Lock(ctx, "job")
	require.NoError(t, err)
	require.NoError(t, lock.Unlock(ctx))

	infos, err := admin.List(ctx)
	require.NoError(t, err)
	require.Len(t, infos, 1)
	assert.False(t, infos[0].ReleasedAt.IsZero(), "List: released")

	runs, err := admin.Runs(ctx, "job", time.Hour)
	require.NoError(t, err)
	require.Len(t, runs, 1)
	assert.Equal(t, "completed", runs[0].Outcome, "the run was released by its holder: %+v", runs[0])
	assert.False(t, runs[0].EndedAt.IsZero(), "a released run has ended: %+v", runs[0])
}

// Guarantee: the purge (Migrate's, Admin.Purge) keeps the run whose fence
// the lease row still carries, however long ago it started (a long job's;
// here its start is set back two hours), so that its end is recorded.
func testRunsPurgeKeepsTheRunHoldingTheKey(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	j := mustJob(t, pgtest.Locker(t, pool, table, "a"), pglease.WithPeriod(24*time.Hour))
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	lock, err := j.Lock(ctx, "job")
	require.NoError(t, err)
	defer func() { _ = lock.Unlock(ctx) }()
	_, err = pool.Exec(ctx, fmt.Sprintf("UPDATE %s SET started_at = started_at - interval '2 hours'", pgx.Identifier{table + "_run"}.Sanitize()))
	require.NoError(t, err)

	_, err = admin.Purge(ctx, time.Hour)
	require.NoError(t, err)
	runs, err := admin.Runs(ctx, "job", 24*time.Hour)
	require.NoError(t, err)
	require.Len(t, runs, 1, "the run holding the key was purged from the ledger while it runs")
	assert.Equal(t, "running", runs[0].Outcome)
}

// Guarantee: as a claim of unknown outcome, a claim of a tick whose round
// trip outlasts its trust window hands out no lease, is given back as a run
// that ran nothing, and its tick is run once by a replica with catch-up.
func testRunsAClaimPastItsTrustWindowIsGivenBackAndItsTickRunOnce(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period, ttl = 4 * time.Second, 300 * time.Millisecond
	db := pgtest.NewFaultyDB(pool)
	opts := []pglease.Option{pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(100 * time.Millisecond)}
	a := mustJob(t, pgtest.Locker(t, db, table, "a", opts...), pglease.WithPeriod(period), pglease.WithCatchUp())
	b := mustJob(t, pgtest.Locker(t, pool, table, "b", opts...), pglease.WithPeriod(period), pglease.WithCatchUp())
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	sleepToPhase(period, 0.05)
	open := db.Hold("claim")
	claimed := make(chan error, 1)
	go func() {
		_, err := a.Lock(ctx, "job")
		claimed <- err
	}()
	<-db.Entered
	time.Sleep(ttl) // a round trip longer than the trust window
	open()
	err = <-claimed
	require.ErrorContains(t, err, "longer than the trust window")
	row, ok := pgtest.ReadRow(t, pool, table, "job")
	require.True(t, ok)

	lock, err := b.Lock(ctx, "job")
	if assert.NoError(t, err, "nobody ran the tick: b, with catch-up, must run it") {
		_ = lock.Unlock(ctx)
	}
	runs, err := admin.Runs(ctx, "job", time.Hour)
	require.NoError(t, err)
	if r, ok := runOf(runs, row.Fence); ok {
		assert.NotEqual(t, "completed", r.Outcome, "fence %d never handed out, yet completed: %+v", row.Fence, runs)
	}
}

// Guarantee (GUIDE, "Ticks"): a skipped tick is "listed only if no replica
// ran that tick after all", and a claim given back "ran nothing". Case: b's
// claim of tick 2 is refused while the run of tick 1 holds the key (the
// tick is entered as skipped); the run ends; a's claim of tick 2 commits
// but its reply is lost, so it is given back; no replica runs tick 2. The
// ledger must still say tick 2 was skipped: nobody ran it.
func testRunsASkippedTickIsListedWhenItsOnlyClaimSinceWasGivenBack(t *testing.T) {
	t.Parallel()
	ctx, pool, table := pgtest.Setup(t)
	const period = 2 * time.Second
	nem := pgtest.NewNemesisDB(t, pool, 1)
	a := mustJob(t, pgtest.Locker(t, nem, table, "a"), pglease.WithPeriod(period))
	b := mustJob(t, pgtest.Locker(t, pool, table, "b"), pglease.WithPeriod(period))
	c := mustJob(t, pgtest.Locker(t, pool, table, "c"), pglease.WithPeriod(period))
	admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)

	// The case needs b's and a's claims inside tick 2's window, each sent
	// and answered there; a machine that stalls one of them past it is
	// another case, so the scenario runs again on a new key, three times at
	// most.
	for attempt := 1; ; attempt++ {
		key := fmt.Sprintf("job-%d", attempt)
		sleepToPhase(period, 0.1)
		first, err := c.Claim(ctx, key)
		require.NoError(t, err)
		second := first.Tick().Add(period)
		inTick2 := func(from, to time.Time) bool {
			const margin = 100 * time.Millisecond
			return from.After(second.Add(-period/2+margin)) && to.Before(second.Add(period/2-margin))
		}
		time.Sleep(time.Until(second.Add(-period / 4))) // within tick 2's half period, the run of tick 1 still holding the key
		bSent := time.Now()
		_, err = b.Claim(ctx, key)
		bAnswered := time.Now()
		require.ErrorIs(t, err, pglease.ErrHeld)
		require.ErrorContains(t, err, "still holds the key")
		require.NoError(t, first.Unlock(ctx))

		time.Sleep(time.Until(second.Add(period / 10)))
		nem.LoseReplies("claim", 1)
		aSent := time.Now()
		_, err = a.Claim(ctx, key)
		aAnswered := time.Now()
		nem.Heal()
		require.Error(t, err, "a's claim reply was lost")
		require.NotErrorIs(t, err, pglease.ErrHeld)
		if !inTick2(bSent, bAnswered) || !inTick2(aSent, aAnswered) {
			require.Less(t, attempt, 3, "three times the machine stalled a claim out of tick 2's window")
			t.Logf("attempt %d: tick %v, b's claim %v..%v, a's claim %v..%v: not both within the tick's window, again",
				attempt, second, bSent, bAnswered, aSent, aAnswered)
			continue
		}

		runs, err := admin.Runs(ctx, key, time.Hour)
		require.NoError(t, err)
		var of2 []string
		for _, r := range runs {
			if r.Tick.Equal(second) {
				of2 = append(of2, r.Outcome)
			}
		}
		assert.NotContains(t, of2, "completed", "nobody ran tick 2")
		assert.Contains(t, of2, "skipped", "tick 2, which no replica ran, is listed as skipped: %+v", runs)
		return
	}
}
