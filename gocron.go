package pglease

import (
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// funcName matches what runtime.FuncForPC(...).Name() gives a function, a
// method or a closure: an import path, a package name, and dotted
// identifiers, with (*T) receivers, [...] type arguments, funcN closures
// (nested ones numbered .1, .2) and the -fm suffix of a method value.
var funcName = regexp.MustCompile(`^(?:[\w.~-]+/)*[\p{L}_][\p{L}\p{N}_]*(?:\.(?:\(\*?[\p{L}_][\p{L}\p{N}_]*(?:\[[^\]]*\])?\)|[\p{L}_][\p{L}\p{N}_]*(?:\[\.\.\.\])?|\d+))+(?:-fm)?$`)

// closureOrMethod matches the parts of a function name no job name a
// person writes has: a closure, a method value, a receiver.
var closureOrMethod = regexp.MustCompile(`\.func\d+(?:\.|$|-)|-fm$|\(\*?[\p{L}_]`)

// looksLikeFuncName reports whether key is probably gocron's default name
// of a job: a Go function's name with its import path ("/"), of package
// main, or of a closure or method. A dotted name such as "billing.invoice"
// is not taken for one.
func looksLikeFuncName(key string) bool {
	if !funcName.MatchString(key) {
		return false
	}
	return strings.Contains(key, "/") || strings.HasPrefix(key, "main.") || closureOrMethod.MatchString(key)
}

// errUnnamedJob is the Err of EventUnnamedJob: Lock's key looks like
// gocron's default job name, the Go function's name.
var errUnnamedJob = errors.New("pglease: the key looks like a Go function name, gocron's default name of a job given no gocron.WithName: " +
	"it changes when the code moves or is renamed, and two versions of a service would then run the job at once; " +
	"name the job (gocron.WithName, or Locker.Task)")

// StartOnGrid is the gocron job option that puts a DurationJob's runs on the
// multiples of period since the Unix epoch, the same instants on every
// replica; give it the job's period. The first run is the first multiple at
// or after the job is scheduled. It sets gocron.WithStartAt, and panics with
// an *OptionError if period <= 0. See docs/GUIDE.md, "StartOnGrid".
func StartOnGrid(period time.Duration) gocron.JobOption {
	if period <= 0 {
		panic(&OptionError{Option: "StartOnGrid", msg: fmt.Sprintf("StartOnGrid(%v): the period must be positive", period)})
	}
	// A start on the grid in the past, not the next one: gocron moves a
	// past start forward by whole periods to the first at or after the
	// moment it schedules the job, so the first run is on the grid however
	// long after this call the scheduler starts, and the option never fails
	// (WithStartDateTime refuses a start that passed by the time NewJob
	// runs).
	return gocron.WithStartAt(gocron.WithStartDateTimePast(gridFloor(time.Now(), period)))
}

// gridFloor is the last multiple of period since the Unix epoch at or
// before t.
func gridFloor(t time.Time, period time.Duration) time.Time {
	ns, p := t.UnixNano(), int64(period)
	off := ns % p
	if off < 0 {
		off += p // before 1970
	}
	return time.Unix(0, ns-off)
}
