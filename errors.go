package pglease

import (
	"errors"
	"strconv"
)

// Sentinel errors. Every error pglease returns wraps one of these or the
// driver's error with %w, so errors.Is works through the added context.
var (
	// ErrHeld: another holder's lease on the key is live. Contention
	// between replicas, not a failure.
	ErrHeld = errors.New("lease held by another holder")
	// ErrLost: the lease is no longer the key's current lease: a later lease
	// took the key, it lapsed, its trust deadline passed, or an operator
	// revoked or expired it. A lost lease never comes back.
	ErrLost = errors.New("lease lost")
	// ErrReleased is Lease.Err after a successful Unlock.
	ErrReleased = errors.New("lease released")
	// ErrClosed: Claim or Lock after Close; Lease.Err of a lease Close
	// released.
	ErrClosed = errors.New("locker closed")
	// ErrInvalidOption: an option is wrong or given where it does not
	// apply. The error's text names the option, why, and the fix.
	ErrInvalidOption = errors.New("pglease: invalid option")
	// ErrNotFound: Admin.Revoke or ForceExpire found no row for the key.
	ErrNotFound = errors.New("pglease: key not found")
)

// optionError is ErrInvalidOption with its text: the option and its entry
// point, why, and the fix.
type optionError struct{ option, msg string }

func (e *optionError) Error() string        { return "pglease: " + e.msg }
func (e *optionError) Is(target error) bool { return target == ErrInvalidOption }

// claimError is a claim's failure as fmt.Errorf("pglease: claim %q: %w")
// words it, its text made only if read: a losing claim's is seldom logged.
type claimError struct {
	key string
	err error
}

func (e *claimError) Error() string {
	return "pglease: claim " + strconv.Quote(e.key) + ": " + e.err.Error()
}
func (e *claimError) Unwrap() error { return e.err }

// ErrRevoked is wrapped by a lease's Err, and by its EventLost or
// EventReleaseFailed, when an operator revoked it (Admin.Revoke). It is a
// loss: errors.Is(err, ErrLost) holds as well.
var ErrRevoked error = revokedError{}

// revokedError is ErrRevoked: a loss (ErrLost) that reads as a revoke.
type revokedError struct{}

func (revokedError) Error() string        { return "lease revoked by an operator" }
func (revokedError) Is(target error) bool { return target == ErrLost }
