package pglease

import "context"

// ClaimBurstOfJobs is ClaimBurst with the claim of keys[i] made by jobs[i]
// (a JobLocker of l), so that claims on different terms go out in one
// statement. The keys must be distinct. It returns each claim's outcome, in
// the order of keys.
func ClaimBurstOfJobs(ctx context.Context, l *Locker, jobs []*JobLocker, keys []string) ([]*Lease, []error) {
	return prepareBurst(contexts(ctx, len(keys)), l, keys, func(i int, ctx context.Context, key string) (*Lease, error) {
		return jobs[i].Claim(ctx, key)
	})()
}
