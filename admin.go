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

// The operator's view of a lease table: List, Purge, Revoke and
// ForceExpire, which `pglease status`, `purge` and `release` run. They read
// and write the table as a whole, whoever holds its keys, and judge every
// row by the database's clock, never the caller's. They work on a table
// created by Migrate and on one of WithoutFenceColumn (its fence and
// acquired_at are then absent); of the options, only WithTable matters.

// LeaseRow is one row of a lease table as List or Revoke read it.
type LeaseRow struct {
	Key    string
	Holder string // RevokedHolder once revoked
	// Fence is the row's current fence; 0 on a table without fence column.
	Fence int64
	// AcquiredAt is the server time of the row's last claim; zero on a table
	// without acquired_at, or where it is NULL. '-infinity' reads as the
	// earliest instant a timestamptz holds (4714-11-24 BC, 00:00 UTC).
	AcquiredAt time.Time
	// ExpiresAt is the server's expiry of the row. A row pinned with
	// expires_at = 'infinity' (the CHECK allows it) reads as the latest
	// instant a timestamptz holds (294276-12-31 23:59:59.999999 UTC), and
	// NeverExpires says so; '-infinity' as the earliest (see AcquiredAt).
	ExpiresAt time.Time
	// NeverExpires is true when expires_at is 'infinity': the key stays
	// held, and its holder keeps it, until someone changes the row
	// (ForceExpire ends it; Revoke takes it from its holder but keeps the
	// expiry, so that nobody can claim it before ForceExpire).
	NeverExpires bool
	// ServerNow is the server's clock_timestamp() when the row was read, the
	// same for every row of one List: remaining time is ExpiresAt -
	// ServerNow, whatever the caller's clock says.
	ServerNow time.Time
	// Live is ExpiresAt > ServerNow: the key is held, and no other holder
	// can claim it.
	Live bool
}

// ExpiresIn is how long the row had to live when it was read, by the
// server's clock: negative once expired, that long ago; the largest
// Duration when it never expires.
func (r LeaseRow) ExpiresIn() time.Duration { return r.ExpiresAt.Sub(r.ServerNow) }

// List returns every row of the lease table, live and expired, sorted by
// key byte-wise, each with the server's time of the reading. It needs
// SELECT on the table.
func List(ctx context.Context, db DB, opts ...Option) ([]LeaseRow, error) {
	t, err := adminTable(ctx, db, "list", opts)
	if err != nil {
		return nil, err
	}
	rows, err := db.Query(ctx, t.render(sqlstmt.List))
	if err != nil {
		return nil, fmt.Errorf("pglease: list %s: %w", t, err)
	}
	defer rows.Close()
	out := []LeaseRow{}
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
func scanLeaseRow(row pgx.Row) (LeaseRow, *string, error) {
	var (
		r                 LeaseRow
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
func Purge(ctx context.Context, db DB, olderThan time.Duration, opts ...Option) (int64, error) {
	t, err := adminTable(ctx, db, "purge", opts)
	if err != nil {
		return 0, err
	}
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

// Revocation is what Revoke or ForceExpire found and did.
type Revocation struct {
	// Row is the key's row as found (and locked) before any change.
	Row LeaseRow
	// Changed is false when nothing was written: the lease was not live
	// (Row.Live is false), or Revoke found it revoked already
	// (Row.Holder is RevokedHolder).
	Changed bool
	// ExpiresAt is the row's expiry after the change: for Revoke the one it
	// had (for a row that never expires, read as LeaseRow.ExpiresAt is); for
	// ForceExpire ServerNow, or just after Row.AcquiredAt when the server's
	// clock is behind it.
	ExpiresAt time.Time
	// ServerNow is the server's clock when the row was changed (or read,
	// when unchanged).
	ServerNow time.Time
}

// ErrNotFound is returned (wrapped) by Revoke and ForceExpire when the
// table has no row for the key.
var ErrNotFound = errors.New("pglease: key not found")

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
func Revoke(ctx context.Context, db DB, key string, opts ...Option) (Revocation, error) {
	return changeRow(ctx, db, key, rowChange{what: "revoke", sql: sqlstmt.Revoke, revoke: true}, opts)
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
func ForceExpire(ctx context.Context, db DB, key string, opts ...Option) (Revocation, error) {
	return changeRow(ctx, db, key, rowChange{what: "force expire", sql: sqlstmt.ForceExpire}, opts)
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
func changeRow(ctx context.Context, db DB, key string, c rowChange, opts []Option) (Revocation, error) {
	what := c.what
	t, err := adminTable(ctx, db, what, opts)
	if err != nil {
		return Revocation{}, err
	}
	if err := checkKey(key); err != nil {
		return Revocation{}, fmt.Errorf("pglease: %s %q: %w", what, shorten(key), err)
	}
	var rev Revocation
	err = pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
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

// adminTable checks what every admin function is given, before anything
// is sent, and returns the table.
func adminTable(ctx context.Context, db DB, what string, opts []Option) (table, error) {
	mustContext(ctx, what)
	if isNil(db) {
		return table{}, fmt.Errorf("pglease: %s: db is nil", what)
	}
	cfg, err := newConfig(opts, forAdmin)
	if err != nil {
		return table{}, err // names the option
	}
	t, _ := parseTable(cfg.table) // checked by newConfig
	return t, nil
}
