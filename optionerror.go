package pglease

import (
	"cmp"
	"errors"
	"slices"
)

// ErrInvalidOption is wrapped by every error about an option: a value it
// refuses, a combination that cannot work, or an option given to a
// constructor that would ignore it. errors.As with *OptionError says which
// option. NewLocker and NewElector panic with such an error; Migrate,
// Schema and the functions that take options return it.
var ErrInvalidOption = errors.New("pglease: invalid option")

// OptionError names the option that is wrong and says why.
type OptionError struct {
	Option string // the option's function name, e.g. "WithTTL"
	msg    string
}

func (e *OptionError) Error() string { return "pglease: " + e.msg }

// Unwrap makes errors.Is(err, ErrInvalidOption) true.
func (e *OptionError) Unwrap() error { return ErrInvalidOption }

// constructor is what options are given to, with the options it applies.
// An option it does not apply is refused rather than silently ignored: a
// WithRetention given to a Locker, or a WithMinHold to an Elector, would
// otherwise look like a setting that holds.
type constructor struct {
	name    string
	applies []string
	why     map[string]string // why an option does not apply, where whyNot does not say it
	// otherwise says why the options neither why nor whyNot name do not
	// apply; empty: they configure a Locker.
	otherwise string
}

// noDDL says why WithoutFenceColumn does not apply to Migrate and Schema.
var noDDL = map[string]string{
	"WithoutFenceColumn": "it works on an existing table that pglease must not alter: Migrate and Schema do not apply",
}

// whyNot says, by default, why an option does not apply where it is refused.
var whyNot = map[string]string{
	"WithRetention":       "it sets the purge horizon of Migrate",
	"WithLeaderKey":       "it names the key an Elector claims",
	"WithLeaderCallbacks": "only an Elector leads",
}

// lockerOptions are the options of a Locker.
var lockerOptions = []string{
	"WithHolder", "WithTTL", "WithHeartbeatInterval", "WithMinHold", "WithTable",
	"WithTimeout", "WithoutFenceColumn", "WithKeptConnection", "WithLogger", "WithHook",
}

var (
	forLocker  = constructor{name: "NewLocker", applies: lockerOptions}
	forElector = constructor{
		name:    "NewElector",
		applies: append(slices.DeleteFunc(slices.Clone(lockerOptions), func(o string) bool { return o == "WithMinHold" }), "WithLeaderKey", "WithLeaderCallbacks"),
		why:     map[string]string{"WithMinHold": "an Elector's Close hands leadership over at once"},
	}
	// WithoutFenceColumn works on an existing table that pglease must not
	// alter: there is no DDL to run or print for it.
	forMigrate = constructor{name: "Migrate", applies: []string{"WithTable", "WithRetention"}, why: noDDL}
	forSchema  = constructor{name: "Schema", applies: []string{"WithTable"}, why: noDDL}
	forJob     = constructor{
		name:      "Locker.Job",
		applies:   []string{"WithTTL", "WithMinHold", "WithTimeout"},
		otherwise: "it is a setting of the whole Locker (one holder, one table, one heartbeat for every job): a job takes only WithTTL, WithMinHold and WithTimeout",
	}
	// The admin functions read whichever columns the table has, so
	// WithoutFenceColumn, which describes the table, is welcome but not
	// needed.
	forAdmin = constructor{name: "List, Purge, Revoke and ForceExpire", applies: []string{"WithTable", "WithoutFenceColumn"}}
)

// refuseUnused records an error for each option given that ctor ignores.
func (c *config) refuseUnused(ctor constructor) {
	for _, o := range c.given {
		if slices.Contains(ctor.applies, o) {
			continue
		}
		why, ok := ctor.why[o]
		if !ok {
			why, ok = whyNot[o]
		}
		if !ok {
			why = cmp.Or(ctor.otherwise, "it configures a Locker")
		}
		c.invalid(o, "%s does not apply to %s: %s", o, ctor.name, why)
	}
}
