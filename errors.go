package pglease

import "errors"

// Sentinel errors. Every error pglease returns wraps one of these or the
// driver's error with %w, so errors.Is works through the added context.
var (
	// ErrHeld means another holder's lease on the key is live. It is the
	// normal outcome of contention between replicas, not a failure.
	ErrHeld = errors.New("lease held by another holder")

	// ErrLost means the lease is no longer the key's current lease: a later
	// claim (by another holder, or by the same holder again) took the key,
	// or the lease lapsed before it could be extended. A lost lease never
	// comes back.
	ErrLost = errors.New("lease lost to another holder")

	// ErrReleased is what Lease.Err reports after a successful Unlock.
	ErrReleased = errors.New("lease released")

	// ErrClosed is returned by Claim and Lock once Close has been called, and
	// is what Lease.Err reports for a lease that Close released.
	ErrClosed = errors.New("locker closed")

	// ErrInvalidOption is wrapped by every error about an option: a value
	// it refuses, a nil option, or a combination that cannot work.
	// errors.As with *OptionError says which option. New, Locker.Job,
	// NewElector, Migrate, Schema and NewAdmin return such an error;
	// NewLocker panics with it.
	ErrInvalidOption = errors.New("pglease: invalid option")

	// ErrNotFound is returned (wrapped) by Admin.Revoke and
	// Admin.ForceExpire when the table has no row for the key.
	ErrNotFound = errors.New("pglease: key not found")

	// ErrUnnamedJob is the Err of EventUnnamedJob: the key Lock was given
	// looks like gocron's default job name, the Go function's name.
	ErrUnnamedJob = errors.New("pglease: the key looks like a Go function name, gocron's default name of a job given no gocron.WithName: " +
		"it changes when the code moves or is renamed, and two versions of a service would then run the job at once; " +
		"name the job (gocron.WithName, or Locker.Task)")
)

// OptionError names the option that is wrong and says why, and how to fix
// it where that is not plain from why.
type OptionError struct {
	Option string // the option's function name, e.g. "WithTTL"
	msg    string
}

func (e *OptionError) Error() string { return "pglease: " + e.msg }

// Unwrap makes errors.Is(err, ErrInvalidOption) true.
func (e *OptionError) Unwrap() error { return ErrInvalidOption }

// ErrRevoked is what a lease's Err, and the error of its EventLost or
// EventReleaseFailed, wrap when an operator revoked it (Admin.Revoke, `pglease
// release`): its row's holder is RevokedHolder. It is a loss like any
// other, so errors.Is(err, ErrLost) holds as well; its message says who
// took the lease.
var ErrRevoked error = revokedError{}

// revokedError is ErrRevoked: a loss (ErrLost) that reads as a revoke.
type revokedError struct{}

func (revokedError) Error() string        { return "lease revoked by an operator" }
func (revokedError) Is(target error) bool { return target == ErrLost }
