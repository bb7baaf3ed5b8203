package pglease_test

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// BenchmarkReleaseNotifyCost measures a release (Unlock, one round trip)
// on a durable server with the pg_notify of the released key, without it
// (the statement before waiting claims existed), and with it while another
// Locker LISTENs (the notification is then queued for delivery), side by
// side; each with the release's asynchronous commit (commit=async, as a
// Locker sends it) and committing synchronously (commit=sync): a
// notification is queued at commit under one server-wide lock, held
// through the WAL flush of a synchronous commit.
func BenchmarkReleaseNotifyCost(b *testing.B) {
	srv := durableServer(b)
	for _, commit := range []string{"async", "sync"} {
		for _, variant := range []string{"without_notify", "with_notify", "with_notify_and_listener"} {
			b.Run("commit="+commit+"/"+variant, func(b *testing.B) {
				ctx := context.Background()
				pool := benchPool(b, srv.DSN(), 8, nil)
				table := benchTable(b, pool, "wait")
				l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("a"), pglease.WithLogger(pgtest.Quiet))
				defer l.Close(ctx)
				if variant == "without_notify" {
					pglease.DropReleaseNotify(l)
				}
				if commit == "sync" {
					pglease.SyncRelease(l)
				}
				if variant == "with_notify_and_listener" {
					other := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("b"), pglease.WithLogger(pgtest.Quiet))
					defer other.Close(ctx)
					wctx, cancel := context.WithCancel(ctx)
					defer cancel()
					go func() { _, _ = other.ClaimWait(wctx, "never-released") }()
					for m, _ := other.WaitMode(); m != pglease.WaitByNotification; m, _ = other.WaitMode() {
						time.Sleep(time.Millisecond)
					}
				}
				var spent time.Duration
				b.ResetTimer()
				for b.Loop() {
					lease, err := l.Claim(ctx, "job")
					require.NoError(b, err)
					start := time.Now()
					require.NoError(b, lease.Unlock(ctx))
					spent += time.Since(start)
				}
				b.ReportMetric(float64(spent.Microseconds())/float64(b.N), "us/release")
			})
		}
	}
}

// BenchmarkWakeLatency measures how long a waiting claim takes to hold the
// key after the holder's Unlock is called: woken by notification, and by
// polling (a DB that is not a pool), in the same run. Each handover waits
// 1.5s after the waiter parked, so that polling is at its steady backoff
// (it doubles from 10ms up to MaxPollInterval in about 1.3s).
func BenchmarkWakeLatency(b *testing.B) {
	for _, mode := range []string{"notification", "polling"} {
		b.Run(mode, func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b, pgtest.Server.DSN(), 8, nil)
			table := benchTable(b, pool, "wait")
			holder := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("holder"), pglease.WithLogger(pgtest.Quiet))
			defer holder.Close(ctx)
			var db pglease.DB = pool
			if mode == "polling" {
				db = pgtest.NewFaultyDB(pool)
			}
			waiter := pglease.NewLocker(db, pglease.WithTable(table), pglease.WithHolder("waiter"), pglease.WithLogger(pgtest.Quiet))
			defer waiter.Close(ctx)
			var lat []time.Duration
			for b.Loop() {
				held, err := holder.Claim(ctx, "job")
				require.NoError(b, err)
				got := claimWaitAsync(ctx, waiter, "job")
				for pglease.Waiters(waiter, "job") == 0 {
					time.Sleep(time.Millisecond)
				}
				time.Sleep(1500 * time.Millisecond) // the scenario: polling reaches its steady backoff
				if m, _ := waiter.WaitMode(); mode == "notification" && m != pglease.WaitByNotification {
					b.Fatalf("waiting by %v", m)
				}
				start := time.Now()
				require.NoError(b, held.Unlock(ctx))
				r := <-got
				lat = append(lat, time.Since(start))
				require.NoError(b, r.err)
				require.NoError(b, r.lease.Unlock(ctx))
			}
			reportPercentiles(b, lat)
		})
	}
}

func reportPercentiles(b *testing.B, d []time.Duration) {
	b.Helper()
	slices.Sort(d)
	at := func(p float64) float64 { return float64(d[int(p*float64(len(d)-1))].Microseconds()) / 1000 }
	b.ReportMetric(at(0.5), "p50_ms")
	b.ReportMetric(at(0.99), "p99_ms")
}

// BenchmarkElectorHandover measures the time from the leader's Close to a
// follower leading: before, a follower learned of it at its next IsLeader
// (gocron calls it when a job is due; here every 200ms, a claim each time);
// now its campaign is woken by the release's notification.
func BenchmarkElectorHandover(b *testing.B) {
	const tick = 200 * time.Millisecond
	for _, variant := range []string{"before_isleader_every_200ms", "after_campaign_notified"} {
		b.Run(variant, func(b *testing.B) {
			ctx := context.Background()
			pool := benchPool(b, pgtest.Server.DSN(), 8, nil)
			table := benchTable(b, pool, "wait")
			var lat []time.Duration
			for b.Loop() {
				leader := newElector(b, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("leader"), pglease.WithLogger(pgtest.Quiet)})
				require.NoError(b, leader.IsLeader(ctx))
				led := make(chan time.Time, 1)
				var stop func()
				if variant == "after_campaign_notified" {
					follower := newElector(b, pool, pglease.DefaultLeaderKey, []pglease.Option{pglease.WithTable(table), pglease.WithHolder("follower"), pglease.WithLogger(pgtest.Quiet)},
						pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{OnStartedLeading: func(*pglease.Lease) { led <- time.Now() }}))
					require.ErrorIs(b, follower.IsLeader(ctx), pglease.ErrHeld)
					for m, _ := follower.WaitMode(); m != pglease.WaitByNotification; m, _ = follower.WaitMode() {
						time.Sleep(time.Millisecond)
					}
					stop = func() { require.NoError(b, follower.Close(ctx)) }
				} else {
					// The Elector before: a claim of the leader key at each IsLeader.
					follower := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("follower"), pglease.WithLogger(pgtest.Quiet))
					fctx, cancel := context.WithCancel(ctx)
					done := make(chan struct{})
					go func() {
						defer close(done)
						t := time.NewTicker(tick)
						defer t.Stop()
						for {
							select {
							case <-fctx.Done():
								return
							case <-t.C:
							}
							if _, err := follower.Claim(fctx, pglease.DefaultLeaderKey); err == nil {
								led <- time.Now()
								return
							}
						}
					}()
					stop = func() { cancel(); <-done; require.NoError(b, follower.Close(ctx)) }
				}
				time.Sleep(time.Duration(len(lat)%7) * tick / 7) // spread the Close over the follower's tick
				start := time.Now()
				require.NoError(b, leader.Close(ctx))
				lat = append(lat, (<-led).Sub(start))
				stop()
			}
			reportPercentiles(b, lat)
		})
	}
}
