package pglease

import (
	"context"
	"sync"
)

// ClaimBurstOfJobs is ClaimBurst with the claim of keys[i] made by jobs[i]
// (a JobLocker of l), so that claims on different terms go out in one
// statement. The keys must be distinct. It returns each claim's outcome, in
// the order of keys.
func ClaimBurstOfJobs(ctx context.Context, l *Locker, jobs []*JobLocker, keys []string) ([]*Lease, []error) {
	c := l.claims
	queued := make(chan struct{}, len(keys))
	c.mu.Lock()
	c.onQueue = func() { queued <- struct{}{} }
	c.mu.Unlock()
	c.hold()
	leases, errs := make([]*Lease, len(keys)), make([]error, len(keys))
	var wg sync.WaitGroup
	for i, key := range keys {
		wg.Go(func() { leases[i], errs[i] = jobs[i].Claim(ctx, key) })
		select {
		case <-queued:
		case <-ctx.Done():
		}
	}
	c.release()
	wg.Wait()
	c.mu.Lock()
	c.onQueue = nil
	c.mu.Unlock()
	return leases, errs
}
