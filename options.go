package pglease

import (
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
	"github.com/robfig/cron/v3"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/holder"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// The defaults and bounds of a Locker's terms and keys.
const (
	defaultTTL     = 60 * time.Second      // how long a lease lives without a heartbeat
	defaultTimeout = 5 * time.Second       // one claim made by Lock, one release made by Unlock or Close
	minTTL         = 10 * time.Millisecond // the shortest TTL WithTTL accepts
)

// Option configures NewLocker, Locker.Job, NewElector, Migrate, Schema or
// NewAdmin. Each takes the options marked for it:
//
//	                        NewLocker  Job  NewElector  Migrate  Schema  NewAdmin
//	WithHolder                  x
//	WithTTL                     x       x       x
//	WithTimeout                 x       x       x
//	WithMinHold                 x       x
//	WithPeriod                          x
//	WithCron                            x
//	WithCatchUp                         x
//	WithHeartbeatInterval       x
//	WithTable                   x                         x        x        x
//	WithoutFenceColumn          x                                           x
//	WithKeptConnection          x
//	WithListenDSN               x
//	WithLogger                  x
//	WithHook                    x
//	WithRetention                                         x
//	WithLeaderCallbacks                         x
//
// Any other use, a bad value or the zero Option is an error wrapping
// ErrInvalidOption that names the option and the fix, and nothing is
// written: NewLocker panics with it, the others return it.
type Option struct {
	name  string // the With function, e.g. "WithTTL"
	takes entry  // the entry points that take it
	why   string // why the others do not, and what to use instead
	set   func(*config)
}

// entry is a set of the entry points that take options.
type entry uint8

const (
	atLocker entry = 1 << iota
	atJob
	atElector
	atMigrate
	atSchema
	atAdmin
)

// String names the entry points of e, "NewLocker, Locker.Job and NewElector".
func (e entry) String() string {
	var names []string
	for i, name := range []string{"NewLocker", "Locker.Job", "NewElector", "Migrate", "Schema", "NewAdmin"} {
		if e&(1<<i) != 0 {
			names = append(names, name)
		}
	}
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

// Why the entry points that do not take an option do not.
const (
	lockerWide = "it is a setting of the whole Locker, shared by its jobs and Electors: give it to NewLocker"
	leaseTerms = "it sets the terms of leases: give it to NewLocker, Locker.Job or NewElector"
)

type config struct {
	name       string // WithHolder's value, or defaultHolder
	holder     string // what the Locker stores: name, holder.Sep, a suffix of its own (holder.Own)
	ttl        time.Duration
	heartbeat  time.Duration // 0: ttl/3
	minHold    time.Duration
	minHoldSet bool          // WithMinHold was given
	period     time.Duration // WithPeriod (ticks.go): a job's claims claim ticks
	crontab    string        // WithCron (ticks.go): the same, of a crontab, with its zone
	cron       cron.Schedule // crontab's
	catchUp    bool          // WithCatchUp (ticks.go)
	table      string
	retention  time.Duration
	timeout    time.Duration
	noFence    bool
	keepConn   bool
	listen     *pgx.ConnConfig // WithListenDSN (listen.go)
	logger     *slog.Logger
	hooks      []func(Event)
	errs       []error

	leaderCallbacks LeaderCallbacks // WithLeaderCallbacks (elector.go)
}

// WithHolder names this replica in the holder column, for operators; the
// Locker adds '#' and a random suffix, so replicas may share it. The default
// is hostname-pid; '#' and the revoke marker "pglease:revoked" are refused. See docs/GUIDE.md,
// "WithHolder".
func WithHolder(id string) Option {
	return Option{"WithHolder", atLocker, lockerWide, func(c *config) {
		switch {
		case id == "":
			c.invalid("WithHolder", "WithHolder: holder is empty")
		case id == sqlstmt.RevokedHolder:
			c.invalid("WithHolder", "WithHolder(%q): this holder is reserved for the leases `pglease release` revokes", id)
		case !utf8.ValidString(id) || strings.ContainsRune(id, 0):
			c.invalid("WithHolder", "WithHolder(%q): holder must be valid UTF-8 without NUL bytes", id)
		default:
			c.name = id
		}
	}}
}

// WithTTL sets how long a lease lives without a heartbeat, which is also how
// long the other replicas wait after a holder crashes. The default is
// 60s; a job's and an Elector's is their Locker's.
func WithTTL(d time.Duration) Option {
	return Option{"WithTTL", atLocker | atJob | atElector, leaseTerms, durationOption("WithTTL", d, minTTL, fmt.Sprintf("TTL must be at least %v", minTTL),
		func(c *config) { c.ttl = d })}
}

// WithHeartbeatInterval sets how often the Locker extends its leases. It
// must be less than TTL/2, so that one failed heartbeat is retried before the
// lease lapses. The default is TTL/3.
func WithHeartbeatInterval(d time.Duration) Option {
	return Option{"WithHeartbeatInterval", atLocker, lockerWide, durationOption("WithHeartbeatInterval", d, time.Nanosecond, "interval must be positive",
		func(c *config) { c.heartbeat = d })}
}

// WithMinHold keeps a released lease until acquired_at + d, so that a
// replica whose timer fires a little later cannot run the same tick again.
// It must be <= TTL; the default, 0, expires the lease at Unlock. See
// docs/GUIDE.md, "WithMinHold".
func WithMinHold(d time.Duration) Option {
	return Option{"WithMinHold", atLocker | atJob, "an Elector has no min hold, so that its Close hands leadership over at once; " +
		"Migrate, Schema and NewAdmin claim nothing", durationOption("WithMinHold", d, 0, "min hold must not be negative",
		func(c *config) { c.minHold, c.minHoldSet = d, true })}
}

// WithTable sets the lease table, "name" or "schema.name"; the fence
// sequence is "<name>_fence_seq" beside it. The default is "lease". A bare name the statements use as an alias (h, r, server...) is
// refused: give it with its schema. See docs/GUIDE.md, "WithTable".
func WithTable(name string) Option {
	return Option{"WithTable", atLocker | atMigrate | atSchema | atAdmin, "a job's and an Elector's leases are in their Locker's table: give it to NewLocker", func(c *config) {
		if _, err := driver.ParseTable(name); err != nil {
			c.invalid("WithTable", "WithTable: %v", err)
			return
		}
		c.table = name
	}}
}

// WithRetention sets how long Migrate keeps expired rows before purging them.
// It must be at least an hour: a shorter purge horizon could let a stalled
// claim hand out a smaller fence. The default is 24h.
func WithRetention(d time.Duration) Option {
	return Option{"WithRetention", atMigrate, "it is the purge horizon of Migrate, which alone deletes rows: give it to Migrate", durationOption("WithRetention", d, sqlstmt.MinRetention, fmt.Sprintf("retention must be at least %v: "+
		"a claim draws its fence before it inserts its row, and a shorter purge horizon would let a claim stalled in between "+
		"issue a fence smaller than one already handed out", sqlstmt.MinRetention),
		func(c *config) { c.retention = d })}
}

// WithTimeout bounds each claim made by Lock and each release made by Unlock
// or Close, whose gocron contexts have no deadline. The default is
// 5s; a job's and an Elector's is their Locker's.
func WithTimeout(d time.Duration) Option {
	return Option{"WithTimeout", atLocker | atJob | atElector, leaseTerms, durationOption("WithTimeout", d, time.Nanosecond, "timeout must be positive",
		func(c *config) { c.timeout = d })}
}

// WithoutFenceColumn makes the Locker work on an existing table it cannot
// alter: columns key (unique), holder (text), expires_at (timestamptz),
// optionally acquired_at, and no fence. Fence then returns 0, and a job
// cannot catch up (WithCatchUp). See docs/GUIDE.md, "WithoutFenceColumn".
func WithoutFenceColumn() Option {
	return Option{"WithoutFenceColumn", atLocker | atAdmin, "Migrate and Schema create the fenced table; " +
		"a job and an Elector use their Locker's table: give it to NewLocker and NewAdmin", func(c *config) { c.noFence = true }}
}

// WithKeptConnection makes a Locker on a *pgxpool.Pool of two connections or
// more keep one of them from its first claim until Close, for its heartbeat
// and releases. Size the pool one larger, and close the Locker before the
// pool. See docs/GUIDE.md, "WithKeptConnection".
func WithKeptConnection() Option {
	return Option{"WithKeptConnection", atLocker, lockerWide, func(c *config) { c.keepConn = true }}
}

// WithLogger sets where the Locker reports: routine events at debug level,
// failures at error level. The default is slog.Default();
// slog.New(slog.DiscardHandler) silences it.
func WithLogger(logger *slog.Logger) Option {
	return Option{"WithLogger", atLocker, lockerWide, func(c *config) {
		if logger == nil {
			c.invalid("WithLogger", "WithLogger: logger is nil")
			return
		}
		c.logger = logger
	}}
}

// WithHook registers a function called with every Event of the Locker and
// its Electors, synchronously, in the order registered: it must return
// quickly and must not call the Locker. It may be given several times.
func WithHook(hook func(Event)) Option {
	return Option{"WithHook", atLocker, lockerWide, func(c *config) {
		if hook == nil {
			c.invalid("WithHook", "WithHook: hook is nil")
			return
		}
		c.hooks = append(c.hooks, hook)
	}}
}

// durationOption is the option name with duration d: it applies set when
// d >= least, and is refused otherwise, saying "name(d): why".
func durationOption(name string, d, least time.Duration, why string, set func(*config)) func(*config) {
	return func(c *config) {
		if d < least {
			c.invalid(name, "%s(%v): %s", name, d, why)
			return
		}
		set(c)
	}
}

// invalid records that option was given a value it refuses; format says
// what is wrong, starting with the option's name and value.
func (c *config) invalid(option, format string, args ...any) {
	c.errs = append(c.errs, &optionError{option: option, msg: fmt.Sprintf(format, args...)})
}

// apply applies the options opts given to the entry point at, and records
// each one that at does not take, and the zero Option, as an error.
func (c *config) apply(at entry, opts []Option) {
	for _, o := range opts {
		switch {
		case o.set == nil:
			c.invalid("Option", "the zero Option: make options with the With functions")
		case o.takes&at == 0:
			c.invalid(o.name, "%s does not apply to %s: %s (it applies to %s)", o.name, at, o.why, o.takes)
		default:
			o.set(c)
		}
	}
}

// defaults is the configuration before any option.
func defaults() config {
	return config{
		ttl:       defaultTTL,
		table:     sqlstmt.DefaultTable,
		retention: sqlstmt.DefaultRetention,
		timeout:   defaultTimeout,
	}
}

// newConfig applies a Locker's opts over the defaults and checks the
// combination.
func newConfig(opts []Option) (config, error) {
	c := defaults()
	c.apply(atLocker, opts)
	if c.heartbeat == 0 {
		c.heartbeat = c.ttl / 3
	}
	if c.heartbeat*2 >= c.ttl && c.ttl > 0 {
		c.invalid("WithHeartbeatInterval", "WithHeartbeatInterval(%v): must be less than TTL/2 (TTL is %v)", c.heartbeat, c.ttl)
	}
	if c.minHold > c.ttl {
		c.invalid("WithMinHold", "WithMinHold(%v): must not exceed the TTL (%v)", c.minHold, c.ttl)
	}
	if c.name == "" {
		c.name = holder.Default()
	}
	if c.holder == "" {
		c.holder = holder.Own(c.name)
	}
	// In every mode: a fenced Locker's holder with '#' could have the shape
	// of a WithoutFenceColumn Locker's forged holder (name, '#', 16 hex
	// digits), and be taken over by it while live.
	if strings.Contains(c.name, holder.Sep) {
		c.invalid("WithHolder", "WithHolder(%q): the holder must not contain %q, which separates a Locker's own suffix", c.name, holder.Sep)
	}
	if c.logger == nil {
		c.logger = slog.Default()
	}
	return c, errors.Join(c.errs...)
}
