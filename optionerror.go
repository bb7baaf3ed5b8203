package pglease

import "errors"

// ErrInvalidOption is wrapped by every error about an option: a value it
// refuses, a nil option, or a combination that cannot work. errors.As with
// *OptionError says which option. New, Locker.Job, NewElector, Migrate,
// Schema and NewAdmin return such an error; NewLocker panics with it.
var ErrInvalidOption = errors.New("pglease: invalid option")

// OptionError names the option that is wrong and says why, and how to fix
// it where that is not plain from why.
type OptionError struct {
	Option string // the option's function name, e.g. "WithTTL"
	msg    string
}

func (e *OptionError) Error() string { return "pglease: " + e.msg }

// Unwrap makes errors.Is(err, ErrInvalidOption) true.
func (e *OptionError) Unwrap() error { return ErrInvalidOption }
