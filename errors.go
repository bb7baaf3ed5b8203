package pglease

import "errors"

// Sentinel errors. Every error pglease returns wraps one of these or the
// driver's error with %w, so errors.Is works through the added context.
var (
	// ErrHeld means another holder's lease on the key is live. It is the
	// normal outcome of contention between replicas, not a failure.
	ErrHeld = errors.New("lease held by another holder")

	// ErrLost means the lease is no longer the current mandate: a later
	// claim (by another holder, or by the same holder again) took the key,
	// or the lease lapsed before it could be extended. A lost lease never
	// comes back.
	ErrLost = errors.New("lease lost to another holder")

	// ErrReleased is what Lease.Err reports after a successful Unlock.
	ErrReleased = errors.New("lease released")

	// ErrClosed is returned by Claim and Lock once Close has been called, and
	// is what Lease.Err reports for a lease that Close released.
	ErrClosed = errors.New("locker closed")
)

// ErrRevoked is what a lease's Err, and the error of its EventLost or
// EventReleaseFailed, wrap when an operator revoked it (Revoke, `pglease
// release`): its row's holder is RevokedHolder. It is a loss like any
// other, so errors.Is(err, ErrLost) holds as well; its message says who
// took the lease.
var ErrRevoked error = revokedError{}

// revokedError is ErrRevoked: a loss (ErrLost) that reads as a revoke.
type revokedError struct{}

func (revokedError) Error() string        { return "lease revoked by an operator" }
func (revokedError) Is(target error) bool { return target == ErrLost }
