package pglease

import (
	"slices"
	"strings"
	"time"
)

// LeaseState says how sure a Locker is of a lease it holds.
type LeaseState string

// The states of a held lease. Each is trusted until its TrustUntil; past
// it the lease is lost, whatever the state said.
const (
	LeaseConfirmed LeaseState = "confirmed"  // its last claim or heartbeat extended it
	LeaseRetrying  LeaseState = "retrying"   // the last heartbeat failed; it is retried
	LeaseRowLocked LeaseState = "row_locked" // the last heartbeat found its row locked by another transaction
)

// Leases returns a snapshot of the leases this Locker holds now (Held's
// view), sorted by key. It sends nothing to the database.
func (l *Locker) Leases() []LeaseInfo {
	now := time.Now()
	retrying := l.round.failing()
	var out []LeaseInfo
	for _, ls := range l.snapshot() {
		ls.checkTrust(now)
		ls.mu.Lock()
		held := ls.err == nil
		info := LeaseInfo{
			Key:        ls.key,
			Holder:     ls.holder,
			Fence:      ls.fence,
			AcquiredAt: ls.acquiredAt,
			ExpiresAt:  ls.expiresAt,
			Live:       true,
			TrustUntil: now.Add(ls.trustUntil.Left(now)),
			State:      LeaseConfirmed,
		}
		switch {
		case retrying:
			info.State = LeaseRetrying
		case !ls.skippedSince.IsZero():
			info.State = LeaseRowLocked
		}
		ls.mu.Unlock()
		if held {
			out = append(out, info)
		}
	}
	slices.SortFunc(out, func(a, b LeaseInfo) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// failing reports whether the last heartbeat round failed.
func (r *roundState) failing() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.failed != nil
}
