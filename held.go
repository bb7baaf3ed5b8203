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
	// LeaseConfirmed: its last claim or heartbeat extended it, and no round
	// has failed since.
	LeaseConfirmed LeaseState = "confirmed"
	// LeaseRetrying: the last heartbeat round failed (database unreachable,
	// timeout); it is retried until the lease's trust deadline.
	LeaseRetrying LeaseState = "retrying"
	// LeaseRowLocked: the last round found its row locked by another
	// transaction and skipped it; it is retried until its trust deadline.
	LeaseRowLocked LeaseState = "row_locked"
)

// LeaseInfo is a copy of what a Locker knows of one lease it holds.
type LeaseInfo struct {
	Key    string
	Holder string // the holder column of this mandate (see Lease.Holder)
	Fence  int64  // 0 with WithoutFenceColumn
	// AcquiredAt is the server time of the claim.
	AcquiredAt time.Time
	// ExpiresAt is the server's expiry as last confirmed by a claim or
	// heartbeat.
	ExpiresAt time.Time
	// TrustUntil is the local time (time.Now, with its monotonic reading)
	// until which the Locker trusts the lease without a further heartbeat:
	// before ExpiresAt, by the trust margin and the round trip.
	TrustUntil time.Time
	State      LeaseState
}

// Leases returns a copy of the leases this Locker holds now, sorted by key:
// not released, not lost, and within their trust deadline. It is safe for
// concurrent use and sends nothing to the database; a service can serve it
// on a debug endpoint. (Held returns the Lease of one key.)
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
