package pglease

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/go-co-op/gocron/v2"
)

// Task returns a gocron task and the gocron.WithName option of a job named
// name, its lease's key, for a scheduler whose locker is l or a JobLocker of
// l. run gets the run's lease and a context that ends with it; its error
// goes to gocron and marks a tick's run failed. A run that finds no lease is
// skipped (EventRunWithoutLease). A bad name panics. See docs/GUIDE.md,
// "Locker.Task".
func (l *Locker) Task(name string, run func(ctx context.Context, lease *Lease) error) (gocron.Task, gocron.JobOption) {
	if err := checkKey(name); err != nil {
		panic("pglease: Task: " + err.Error())
	}
	if run == nil {
		panic("pglease: Task: run is nil")
	}
	task := gocron.NewTask(func(ctx context.Context) error {
		lease, ok := l.Held(name)
		if !ok {
			l.once(name, Event{Kind: EventRunWithoutLease, Key: name, Err: errRunWithoutLease})
			return nil
		}
		ctx, cancel := lease.Context(ctx)
		defer cancel()
		err := run(ctx, lease)
		if err != nil {
			lease.failed.Store(true) // before gocron's Unlock, which follows the task's return
		}
		return err
	})
	return task, gocron.WithName(name)
}

// errRunWithoutLease is the Err of EventRunWithoutLease.
var errRunWithoutLease = errors.New("pglease: a run of the job found no lease under its name, and was skipped: " +
	"its lease ended before the run started, or the job's gocron.WithName is not the name given to Task (pass Task's own option); " +
	"reported once per job")

// once emits e the first time it is asked to for e's kind and key.
func (l *Locker) once(key string, e Event) {
	k := e.Kind.String() + "\x00" + key
	l.mu.Lock()
	first := !l.warned[k]
	if first {
		if l.warned == nil {
			l.warned = map[string]bool{}
		}
		l.warned[k] = true
	}
	l.mu.Unlock()
	if first {
		l.cfg.emit(e)
	}
}

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

// warnUnnamed reports, once per key, a key Lock was given that looks like
// a Go function name (EventUnnamedJob, at error level). The job still
// runs: refusing it would stop every unnamed job at an upgrade.
func (l *Locker) warnUnnamed(key string) {
	if looksLikeFuncName(key) {
		l.once(key, Event{Kind: EventUnnamedJob, Key: key, Err: errUnnamedJob})
	}
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
