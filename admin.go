package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/keys"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// Admin is the operator's view of one lease table (what the pglease command
// runs), by the database's clock. It holds no connection, needs no Close,
// and is safe for concurrent use.
type Admin struct {
	db      DB
	table   driver.Table
	noFence bool // WithoutFenceColumn: the table has no ledger of runs
}

// NewAdmin returns an Admin of the table its options name (WithTable) on db,
// or an error: a nil db, or an invalid option (wrapping ErrInvalidOption). It sends nothing to the
// database.
func NewAdmin(db DB, opts ...Option) (*Admin, error) {
	if isNil(db) {
		return nil, errors.New("pglease: new admin: db is nil")
	}
	cfg := defaults()
	cfg.apply(atAdmin, opts)
	if err := errors.Join(cfg.errs...); err != nil {
		return nil, err
	}
	t, _ := driver.ParseTable(cfg.table) // checked by WithTable
	return &Admin{db: db, table: t, noFence: cfg.noFence}, nil
}

// LeaseInfo is a snapshot of one lease: a row of the table as Admin.List
// or Admin.Revoke read it, or a lease a Locker holds as Locker.Leases
// copies it. The fields of one source only are zero in the other's.
type LeaseInfo struct {
	Key          string
	Holder       string    // "pglease:revoked" once revoked (Revoked)
	Fence        int64     // 0 on a table without fence column
	AcquiredAt   time.Time // server time of the last claim; zero on a table without it
	ExpiresAt    time.Time // server expiry: the row's (List), or the last confirmed (Leases)
	NeverExpires bool      // expires_at is 'infinity'
	ServerNow    time.Time // List: the server's clock at the read; ExpiresAt - ServerNow is the time left
	Live         bool      // List: ExpiresAt > ServerNow; every lease of Leases is live
	ReleasedAt   time.Time // List: when its holder released it; zero if it did not (expired: it lapsed)
	Tick         time.Time // the tick of a job's schedule it was claimed for (WithPeriod, WithCron), WithoutFenceColumn read from its holder; zero if none
	TrustUntil   time.Time // Leases: the local time until which the Locker trusts the lease
	Revoked      bool      // List: Admin.Revoke (or `pglease release`) revoked it; no holder has it
	// State, of Leases only, is how sure the Locker is of the lease:
	// "confirmed" (its last claim or heartbeat extended it), "retrying"
	// (the last heartbeat failed; it is retried) or "row_locked" (the last
	// heartbeat found its row locked by another transaction). Each is
	// trusted until TrustUntil; past it the lease is lost.
	State string
}

// List returns every row of the lease table, live and expired, sorted by
// key byte-wise, each with the server's time of the reading. It needs
// SELECT on the table.
func (a *Admin) List(ctx context.Context) ([]LeaseInfo, error) {
	mustContext(ctx, "List")
	rows, err := driver.ListRows(ctx, a.db, a.table)
	if err != nil {
		return nil, fmt.Errorf("pglease: list %s: %w", a.table, err)
	}
	out := make([]LeaseInfo, len(rows))
	for i, r := range rows {
		out[i] = infoOf(r)
	}
	return out, nil
}

// infoOf is a row of the table as List reads it.
func infoOf(r driver.Row) LeaseInfo {
	return LeaseInfo{Key: r.Key, Holder: r.HolderText(), Fence: r.Fence, AcquiredAt: r.AcquiredAt, ExpiresAt: r.ExpiresAt,
		NeverExpires: r.NeverExpires, ServerNow: r.ServerNow, Live: r.Live(), ReleasedAt: r.ReleasedAt, Tick: r.Tick,
		Revoked: r.HolderText() == sqlstmt.RevokedHolder}
}

// Purge deletes the rows expired longer ago than olderThan, by the server's
// clock, and returns how many; a live lease is never deleted. olderThan must
// be at least an hour. It needs DELETE on the table.
func (a *Admin) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	mustContext(ctx, "Purge")
	t := a.table
	if err := checkHorizon(olderThan); err != nil {
		return 0, fmt.Errorf("pglease: purge %s: older than %v: %w", t, olderThan, err)
	}
	n, err := driver.Purge(ctx, a.db, t, olderThan)
	if err != nil {
		return 0, fmt.Errorf("pglease: purge %s: %w", t, err)
	}
	return n, nil
}

// checkHorizon refuses a purge horizon below sqlstmt.MinRetention, saying
// why.
func checkHorizon(d time.Duration) error {
	if d < sqlstmt.MinRetention {
		return fmt.Errorf("must be at least %v: a claim draws its fence before it inserts its row, and a shorter purge horizon would let a claim stalled in between issue a fence smaller than one already handed out", sqlstmt.MinRetention)
	}
	return nil
}

// Revocation is what Revoke or ForceExpire found and did: the row before
// (a LeaseInfo) and the change.
type Revocation struct {
	Row       LeaseInfo // the key's row as found (and locked) before any change
	Changed   bool      // false when nothing was written: not live, or revoked already
	ExpiresAt time.Time // the row's expiry after the change
	ServerNow time.Time // the server's clock when the row was changed (or read)
}

// Revoke takes the live lease on key from its holder without letting anyone
// in early: the row's holder becomes "pglease:revoked", its expiry and fence
// stay. A key not live or revoked already is left as it is (Changed is
// false); a missing key's error wraps ErrNotFound. See docs/GUIDE.md,
// "Admin.Revoke".
func (a *Admin) Revoke(ctx context.Context, key string) (Revocation, error) {
	mustContext(ctx, "Revoke")
	return a.changeRow(ctx, "revoke", key, sqlstmt.RevokedHolder)
}

// ForceExpire expires the live lease on key at once, so that anyone can
// claim it with a greater fence. UNSAFE: its holder may trust it until the
// old expiry, so two replicas may run the job at once; prefer Revoke. A
// missing key's error wraps ErrNotFound. See docs/GUIDE.md,
// "Admin.ForceExpire".
func (a *Admin) ForceExpire(ctx context.Context, key string) (Revocation, error) {
	mustContext(ctx, "ForceExpire")
	return a.changeRow(ctx, "force expire", key, "")
}

// changeRow runs Revoke (marker sqlstmt.RevokedHolder) or ForceExpire (marker
// empty) through driver.ChangeRow.
func (a *Admin) changeRow(ctx context.Context, what, key, marker string) (Revocation, error) {
	if err := keys.Check(key); err != nil {
		return Revocation{}, fmt.Errorf("pglease: %s %q: %w", what, keys.Short(key), err)
	}
	c, err := driver.ChangeRow(ctx, a.db, a.table, key, marker)
	switch {
	case errors.Is(err, driver.ErrNoRow):
		err = fmt.Errorf("in table %s: %w", a.table, ErrNotFound)
	case driver.Is(err, driver.StringTooLong):
		err = fmt.Errorf("the holder column of %s is too short for the revoke marker %q (%d characters); nothing changed "+
			"(ForceExpire expires the lease at once instead, with the risk it documents): %w",
			a.table, sqlstmt.RevokedHolder, len(sqlstmt.RevokedHolder), err)
	}
	if err != nil {
		return Revocation{}, fmt.Errorf("pglease: %s %q: %w", what, keys.Short(key), err)
	}
	return Revocation{Row: infoOf(c.Before), Changed: c.Changed, ExpiresAt: c.ExpiresAt, ServerNow: c.ServerNow}, nil
}

// Run is one run of a job with ticks (WithPeriod), as the ledger of runs
// beside the lease table records it: entered by the claim of its tick, and
// closed by the next.
type Run struct {
	Key       string
	Tick      time.Time
	Fence     int64
	Holder    string
	StartedAt time.Time // the server's time of its claim
	EndedAt   time.Time // zero while it runs, and when unknown
	// Outcome is how the run ended: running, completed, failed, lapsed,
	// revoked, superseded, given back, unknown or skipped. See
	// docs/GUIDE.md, "Run".
	Outcome string
}

// noLedger says why a table WithoutFenceColumn lists no runs.
const noLedger = "a table WithoutFenceColumn has no ledger of runs: the tick of a job's last run is in its row's holder (List); run Migrate for the ledger"

// Runs returns the runs of job key, or of every job when key is "", started
// within since by the server's clock, sorted by key byte-wise, then tick. It
// needs SELECT on the table and its ledger, which a table WithoutFenceColumn
// lacks.
func (a *Admin) Runs(ctx context.Context, key string, since time.Duration) ([]Run, error) {
	mustContext(ctx, "Runs")
	t := a.table
	if since <= 0 {
		return nil, fmt.Errorf("pglease: runs of %s: since %v: must be positive", t, since)
	}
	if a.noFence {
		return nil, fmt.Errorf("pglease: runs of %s: %s", t, noLedger)
	}
	var job *string
	if key != "" {
		job = &key
	}
	runs, err := driver.ListRuns(ctx, a.db, t, job, since)
	if driver.Is(err, driver.UndefinedTable) {
		err = fmt.Errorf("%w (the ledger of runs, %s, is made by Migrate, beside the lease table; %s)", err, sqlstmt.Runs(t.Name).Sanitize(), noLedger)
	}
	if err != nil {
		return nil, fmt.Errorf("pglease: runs of %s: %w", t, err)
	}
	out := make([]Run, len(runs))
	for i, r := range runs {
		out[i] = Run(r)
	}
	return out, nil
}
