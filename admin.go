package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// Admin is the operator's view of one lease table: List, Purge, Revoke and
// ForceExpire, which `pglease status`, `purge` and `release` run. They read
// and write the table as a whole, whoever holds its keys, and judge every
// row by the database's clock, never the caller's. They work on a table
// created by Migrate and on one of WithoutFenceColumn (its fence and
// acquired_at are then absent). An Admin holds no connection and starts
// nothing: it needs no Close, and is safe for concurrent use.
type Admin struct {
	db    DB
	table table
}

// NewAdmin returns an Admin of the table its options name (WithTable; the
// default is DefaultTable) on db, or an error: a nil db, or an invalid
// option (an *OptionError). It sends nothing to the database.
func NewAdmin(db DB, opts ...Option) (*Admin, error) {
	if isNil(db) {
		return nil, errors.New("pglease: new admin: db is nil")
	}
	cfg := defaults()
	cfg.apply(atAdmin, opts)
	if err := errors.Join(cfg.errs...); err != nil {
		return nil, err
	}
	t, _ := parseTable(cfg.table) // checked by WithTable
	return &Admin{db: db, table: t}, nil
}

// LeaseInfo is a snapshot of one lease: a row of the table as Admin.List
// or Admin.Revoke read it, or a lease a Locker holds as Locker.Leases
// copies it. The fields of one source only are zero in the other's.
type LeaseInfo struct {
	Key    string
	Holder string // RevokedHolder once revoked (see Lease.Holder)
	// Fence is the lease's fence; 0 on a table without fence column.
	Fence int64
	// AcquiredAt is the server time of the lease's last claim; zero on a
	// table without acquired_at, or where it is NULL. '-infinity' reads as
	// the earliest instant a timestamptz holds (4714-11-24 BC, 00:00 UTC).
	AcquiredAt time.Time
	// ExpiresAt is the server's expiry: the row's (List), or as last
	// confirmed by a claim or heartbeat (Leases). A row pinned with
	// expires_at = 'infinity' (the CHECK allows it) reads as the latest
	// instant a timestamptz holds (294276-12-31 23:59:59.999999 UTC), and
	// NeverExpires says so; '-infinity' as the earliest (see AcquiredAt).
	ExpiresAt time.Time
	// NeverExpires is true when expires_at is 'infinity': the key stays
	// held, and its holder keeps it, until someone changes the row
	// (ForceExpire ends it; Revoke takes it from its holder but keeps the
	// expiry, so that nobody can claim it before ForceExpire).
	NeverExpires bool
	// ServerNow (List) is the server's clock_timestamp() when the row was
	// read, the same for every row of one List: remaining time is
	// ExpiresAt - ServerNow, whatever the caller's clock says.
	ServerNow time.Time
	// Live is ExpiresAt > ServerNow (List): the key is held, and no other
	// holder can claim it. Every lease Leases returns is live.
	Live bool
	// TrustUntil (Leases) is the local time (time.Now, with its monotonic
	// reading) until which the Locker trusts the lease without a further
	// heartbeat: before ExpiresAt, by the trust margin and the round trip.
	TrustUntil time.Time
	// State (Leases) says how sure the Locker is of the lease.
	State LeaseState
}

// ExpiresIn is how long the row had to live when List read it, by the
// server's clock: negative once expired, that long ago; the largest
// Duration when it never expires.
func (r LeaseInfo) ExpiresIn() time.Duration { return r.ExpiresAt.Sub(r.ServerNow) }

// List returns every row of the lease table, live and expired, sorted by
// key byte-wise, each with the server's time of the reading. It needs
// SELECT on the table.
func (a *Admin) List(ctx context.Context) ([]LeaseInfo, error) {
	mustContext(ctx, "List")
	t, db := a.table, a.db
	rows, err := db.Query(ctx, t.render(sqlstmt.List))
	if err != nil {
		return nil, fmt.Errorf("pglease: list %s: %w", t, err)
	}
	defer rows.Close()
	out := []LeaseInfo{}
	for rows.Next() {
		r, _, err := scanLeaseRow(rows)
		if err != nil {
			return nil, fmt.Errorf("pglease: list %s: %w", t, err)
		}
		out = append(out, r)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("pglease: list %s: %w", t, err)
	}
	return out, nil
}

// scanLeaseRow reads key, holder, fence, acquired_at, expires_at and the
// server's time, holder, fence and acquired_at possibly null. It returns
// the holder as stored too: nil when NULL, which the row reads as empty.
func scanLeaseRow(row pgx.Row) (LeaseInfo, *string, error) {
	var (
		r                 LeaseInfo
		holder            *string
		fence             *int64
		acquired, expires pgtype.Timestamptz
	)
	if err := row.Scan(&r.Key, &holder, &fence, &acquired, &expires, &r.ServerNow); err != nil {
		return r, nil, err
	}
	if holder != nil {
		r.Holder = *holder
	}
	if fence != nil {
		r.Fence = *fence
	}
	r.AcquiredAt, r.ExpiresAt = serverTime(acquired), serverTime(expires)
	r.NeverExpires = expires.InfinityModifier == pgtype.Infinity
	r.Live = r.ExpiresAt.After(r.ServerNow)
	return r, holder, nil
}

// serverTime is a timestamptz as a time: zero when NULL, and 'infinity'
// and '-infinity', which a time.Time cannot be, as the latest and the
// earliest instants a finite timestamptz holds, so that they still compare
// after and before every other (the heartbeat reports a pinned row's
// expiry as that same latest instant). Read as a time.Time, an infinite
// value would fail the scan, and so the reading of the whole table.
func serverTime(ts pgtype.Timestamptz) time.Time {
	switch {
	case !ts.Valid:
		return time.Time{}
	case ts.InfinityModifier == pgtype.Infinity:
		return time.Date(294276, time.December, 31, 23, 59, 59, 999999000, time.UTC)
	case ts.InfinityModifier == pgtype.NegativeInfinity:
		return time.Date(-4713, time.November, 24, 0, 0, 0, 0, time.UTC) // 4714 BC
	}
	return ts.Time
}

// Purge deletes the rows expired longer ago than olderThan, by the
// server's clock, with the statement Migrate purges with, and returns how
// many. A live lease is never deleted. olderThan must be at least
// MinRetention: a shorter horizon would let a claim that stalled between
// drawing its fence and inserting its row issue a fence smaller than one
// already handed out. It needs DELETE on the table.
func (a *Admin) Purge(ctx context.Context, olderThan time.Duration) (int64, error) {
	mustContext(ctx, "Purge")
	t, db := a.table, a.db
	if err := checkHorizon(olderThan); err != nil {
		return 0, fmt.Errorf("pglease: purge %s: older than %v: %w", t, olderThan, err)
	}
	n, err := purge(ctx, db, t, olderThan)
	if err != nil {
		return 0, fmt.Errorf("pglease: purge %s: %w", t, err)
	}
	return n, nil
}

// checkHorizon refuses a purge horizon below MinRetention, saying why.
func checkHorizon(d time.Duration) error {
	if d < MinRetention {
		return fmt.Errorf("must be at least MinRetention (%v): a claim draws its fence before it inserts its row, and a shorter purge horizon would let a claim stalled in between issue a fence smaller than one already handed out", MinRetention)
	}
	return nil
}

// Revocation is what Revoke or ForceExpire found and did: the row before
// (a LeaseInfo) and the change.
type Revocation struct {
	// Row is the key's row as found (and locked) before any change.
	Row LeaseInfo
	// Changed is false when nothing was written: the lease was not live
	// (Row.Live is false), or Revoke found it revoked already
	// (Row.Holder is RevokedHolder).
	Changed bool
	// ExpiresAt is the row's expiry after the change: for Revoke the one it
	// had (for a row that never expires, read as LeaseInfo.ExpiresAt is); for
	// ForceExpire ServerNow, or just after Row.AcquiredAt when the server's
	// clock is behind it.
	ExpiresAt time.Time
	// ServerNow is the server's clock when the row was changed (or read,
	// when unchanged).
	ServerNow time.Time
}

// Revoke takes the live lease on key away from its holder, whoever it is,
// without letting any other holder in early: the row's holder becomes
// RevokedHolder, and its expiry and fence stay as they were. The holder
// loses the lease at its next heartbeat (its lease's Context is
// cancelled), cannot claim it back, and no holder can claim the key before
// the lease would have expired, by which time its holder has stopped
// trusting it whatever happened to its heartbeat. The next claim then takes
// a greater fence. A key that is not live, or revoked already, is left as
// it was (Changed is false). A missing key is an error wrapping
// ErrNotFound. It needs SELECT and UPDATE on the table, and a holder column
// that takes RevokedHolder (a varchar too short refuses it: see
// ForceExpire).
func (a *Admin) Revoke(ctx context.Context, key string) (Revocation, error) {
	mustContext(ctx, "Revoke")
	return a.changeRow(ctx, key, rowChange{what: "revoke", sql: sqlstmt.Revoke, revoke: true})
}

// ForceExpire expires the live lease on key at once, so that any holder can
// claim it (with a greater fence) right away; holder and fence are kept.
// UNSAFE: its holder goes on believing it holds the lease until its next
// heartbeat, or up to the old expiry (Row.ExpiresAt) if that heartbeat
// fails, so two replicas may run the job at once. Use Revoke unless waiting
// for the old expiry is worse. When the server's clock is behind the row's
// acquired_at (set back since the claim), the key stays held until just
// after it: ExpiresAt is then after ServerNow. A key that is not live is
// left as it was; a missing key is an error wrapping ErrNotFound.
func (a *Admin) ForceExpire(ctx context.Context, key string) (Revocation, error) {
	mustContext(ctx, "ForceExpire")
	return a.changeRow(ctx, key, rowChange{what: "force expire", sql: sqlstmt.ForceExpire})
}

// rowChange is Revoke or ForceExpire.
type rowChange struct {
	what   string // for errors
	sql    string // sqlstmt.Revoke or sqlstmt.ForceExpire
	revoke bool
}

// changeRow runs Revoke or ForceExpire in one transaction: it locks the
// key's row, then changes it if it is live (and, for Revoke, not revoked
// yet).
func (a *Admin) changeRow(ctx context.Context, key string, c rowChange) (Revocation, error) {
	what, t, db := c.what, a.table, a.db
	if err := checkKey(key); err != nil {
		return Revocation{}, fmt.Errorf("pglease: %s %q: %w", what, shorten(key), err)
	}
	var rev Revocation
	err := pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		row, holder, err := scanLeaseRow(tx.QueryRow(ctx, t.render(sqlstmt.LockRow), key))
		if errors.Is(err, pgx.ErrNoRows) {
			return fmt.Errorf("in table %s: %w", t, ErrNotFound)
		}
		if err != nil {
			return err
		}
		rev = Revocation{Row: row, ExpiresAt: row.ExpiresAt, ServerNow: row.ServerNow}
		if !row.Live || c.revoke && row.Holder == RevokedHolder {
			return nil
		}
		args := []any{key, holder} // nil for a NULL holder, matched as NULL
		if c.revoke {
			args = append(args, RevokedHolder)
		}
		var expires pgtype.Timestamptz // Revoke keeps an infinite expiry
		err = tx.QueryRow(ctx, t.render(c.sql), args...).Scan(&expires, &rev.ServerNow)
		rev.ExpiresAt = serverTime(expires)
		var pgErr *pgconn.PgError
		if errors.As(err, &pgErr) && pgErr.Code == "22001" { // string_data_right_truncation
			return fmt.Errorf("the holder column of %s is too short for the revoke marker %q (%d characters); nothing changed "+
				"(ForceExpire expires the lease at once instead, with the risk it documents): %w",
				t, RevokedHolder, len(RevokedHolder), err)
		}
		rev.Changed = err == nil
		return err
	})
	if err != nil {
		return Revocation{}, fmt.Errorf("pglease: %s %q: %w", what, shorten(key), err)
	}
	return rev, nil
}
