package pglease_test

import (
	"context"
	"fmt"
	"sync"
	"testing"

	"github.com/pglease/pglease"
)

// burstSizes are the bursts of BenchmarkClaimBurst; -short stops at 100.
func burstSizes() []int {
	if testing.Short() {
		return []int{1, 10, 100}
	}
	return []int{1, 10, 100, 1000}
}

// BenchmarkClaimBurst measures a tick on one replica: B Lock calls of B
// distinct keys, made at the same instant on one Locker (as gocron makes
// them when B jobs are due together), on a durable private server. One op
// is one burst, timed until every call has its outcome; its leases are
// then unlocked, untimed. "coalesced" is the Locker as it is; "per-claim"
// is the same Locker sending one statement per claim and per release, as
// before coalescing. stmts/op and walsyncs/op count the claim statements
// and the WAL fsyncs of one burst. The pool has 10 connections.
func BenchmarkClaimBurst(b *testing.B) {
	srv := durableServer(b)
	stats := statsConn(b, srv)

	for _, size := range burstSizes() {
		keys := make([]string, size)
		for i := range keys {
			keys[i] = fmt.Sprintf("job-%04d", i)
		}
		for _, coalesce := range []bool{true, false} {
			name := "coalesced"
			if !coalesce {
				name = "per-claim"
			}
			b.Run(fmt.Sprintf("B=%d/%s", size, name), func(b *testing.B) {
				tracer := &stmtTracer{}
				pool := benchPool(b, srv.DSN(), 10, tracer)
				table := benchTable(b, pool, "burst")
				l := benchLocker(b, pool, table, "replica")
				pglease.SetCoalescing(l, coalesce)
				ctx := context.Background()
				burst(ctx, b, l, keys) // prepares the statements on the connections

				flushBackendStats(b, pool)
				syncsBefore := walSyncs(b, stats)
				claimsBefore := tracer.endedOf("claim")
				b.ResetTimer()
				for range b.N {
					leases := burst(ctx, b, l, keys)
					b.StopTimer()
					unlockAll(ctx, b, leases)
					b.StartTimer()
				}
				b.StopTimer()
				b.ReportMetric(float64(tracer.endedOf("claim")-claimsBefore)/float64(b.N), "stmts/op")
				flushBackendStats(b, pool)
				b.ReportMetric(float64(walSyncs(b, stats)-syncsBefore)/float64(b.N), "walsyncs/op")
			})
		}
	}
}

// burst calls Lock for every key at once, one goroutine each, and returns
// the leases once every call has returned.
func burst(ctx context.Context, b *testing.B, l *pglease.Locker, keys []string) []*pglease.Lease {
	b.Helper()
	leases := make([]*pglease.Lease, len(keys))
	errs := make([]error, len(keys))
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() {
			<-start
			lock, err := l.Lock(ctx, key)
			if err == nil {
				leases[i] = lock.(*pglease.Lease)
			}
			errs[i] = err
		})
	}
	close(start)
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
	return leases
}

// unlockAll unlocks leases at once, one goroutine each.
func unlockAll(ctx context.Context, b *testing.B, leases []*pglease.Lease) {
	b.Helper()
	var wg sync.WaitGroup
	errs := make([]error, len(leases))
	for i, ls := range leases {
		wg.Go(func() { errs[i] = ls.Unlock(ctx) })
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkJobCycleCoalescing measures the steady job run (Claim, then
// Unlock, on one key per goroutine, one Locker for all) on a durable
// private server, with coalescing ("coalesced") and with one statement per
// claim and release ("per-claim"), and the two alternating ("interleaved"):
// coalescing must cost this cycle nothing.
func BenchmarkJobCycleCoalescing(b *testing.B) {
	srv := durableServer(b)
	for _, goroutines := range []int{1, 4, 16} {
		keys := make([]string, goroutines)
		for g := range keys {
			keys[g] = fmt.Sprintf("job-%d", g)
		}
		for _, coalesce := range []bool{true, false} {
			name := "coalesced"
			if !coalesce {
				name = "per-claim"
			}
			b.Run(fmt.Sprintf("goroutines=%d/%s", goroutines, name), func(b *testing.B) {
				tracer := &stmtTracer{}
				pool := benchPool(b, srv.DSN(), int32(goroutines)+2, tracer)
				table := benchTable(b, pool, "cycle")
				l := benchLocker(b, pool, table, "replica")
				pglease.SetCoalescing(l, coalesce)
				cycles := make([]cycle, goroutines)
				for g := range cycles {
					cycles[g] = lockerCycle(l)
				}
				runCycles(b, tracer, cycles, keys, nil)
			})
		}
		// The two alternating, cycle by cycle, on one pool and table:
		// per-claim/coalesced is how many times faster coalescing makes the
		// cycle under the same load.
		b.Run(fmt.Sprintf("goroutines=%d/interleaved", goroutines), func(b *testing.B) {
			pool := benchPool(b, srv.DSN(), int32(goroutines)+2, nil)
			table := benchTable(b, pool, "cycle")
			on := benchLocker(b, pool, table, "coalesced")
			off := benchLocker(b, pool, table, "per-claim")
			pglease.SetCoalescing(off, false)
			x, y := make([]cycle, goroutines), make([]cycle, goroutines)
			for g := range keys {
				x[g], y[g] = lockerCycle(off), lockerCycle(on)
			}
			runInterleaved(b, variant{"per-claim", x}, variant{"coalesced", y}, keys)
		})
	}
}
