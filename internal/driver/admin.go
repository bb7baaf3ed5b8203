package driver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// Row is a row of a lease table as an operator reads it, with the
// server's clock at the reading. Every statement here runs on one
// connection of db (OnOneConnection).
type Row struct {
	Key          string
	Holder       *string // nil when NULL
	Fence        int64   // 0 when NULL: a table without fence column
	AcquiredAt   time.Time
	ExpiresAt    time.Time
	NeverExpires bool // expires_at is 'infinity'
	ServerNow    time.Time
	ReleasedAt   time.Time
	Tick         time.Time // the tick column's, or the holder's (WithoutFenceColumn)
}

// Live says whether the row's lease was live when it was read.
func (r Row) Live() bool { return r.ExpiresAt.After(r.ServerNow) }

// HolderText is the row's holder, empty when NULL.
func (r Row) HolderText() string {
	if r.Holder == nil {
		return ""
	}
	return *r.Holder
}

// ListRows reads every row of t (sqlstmt.List).
func ListRows(ctx context.Context, db DB, t Table) ([]Row, error) {
	out := []Row{}
	err := OnOneConnection(ctx, db, func(db DB) error {
		rows, err := db.Query(ctx, t.Render(sqlstmt.List))
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			r, err := scanRow(rows)
			if err != nil {
				return err
			}
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// scanRow reads key, holder, fence, acquired_at, expires_at, the server's
// time, released_at and tick, all but key, expires_at and the server's
// time possibly null.
func scanRow(row pgx.Row) (Row, error) {
	var (
		r                 Row
		fence             *int64
		acquired, expires pgtype.Timestamptz
		released, tick    pgtype.Timestamptz
	)
	if err := row.Scan(&r.Key, &r.Holder, &fence, &acquired, &expires, &r.ServerNow, &released, &tick); err != nil {
		return r, err
	}
	if fence != nil {
		r.Fence = *fence
	}
	r.AcquiredAt, r.ExpiresAt = ServerTime(acquired), ServerTime(expires)
	r.ReleasedAt, r.Tick = ServerTime(released), ServerTime(tick)
	if !tick.Valid {
		r.Tick = tickOfHolder(r.HolderText())
	}
	r.NeverExpires = expires.InfinityModifier == pgtype.Infinity
	return r, nil
}

// tickOfHolder is the tick a holder written by the claim of a job's tick
// WithoutFenceColumn carries after '@' (sqlstmt.UnfencedClaimTick), or
// zero.
func tickOfHolder(holder string) time.Time {
	n := sqlstmt.TickSuffixLen
	if len(holder) < n || holder[len(holder)-n] != '@' {
		return time.Time{}
	}
	tick, err := time.Parse(sqlstmt.TickLayout, holder[len(holder)-n+1:])
	if err != nil {
		return time.Time{}
	}
	return tick
}

// ServerTime is a timestamptz as a time: zero when NULL, and 'infinity'
// and '-infinity', which a time.Time cannot be, as the latest and the
// earliest instants a finite timestamptz holds, so that they still compare
// after and before every other (the heartbeat reports a pinned row's
// expiry as that same latest instant). Read as a time.Time, an infinite
// value would fail the scan, and so the reading of the whole table.
func ServerTime(ts pgtype.Timestamptz) time.Time {
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

// RowChange is what ChangeRow found and did.
type RowChange struct {
	Before    Row       // the key's row as found (and locked) before any change
	Changed   bool      // false when nothing was written
	ExpiresAt time.Time // the row's expiry after the change
	ServerNow time.Time // the server's clock when the row was changed (or read)
}

// ErrNoRow is ChangeRow's error when the key has no row.
var ErrNoRow = errors.New("no row")

// ChangeRow runs sqlstmt.Revoke (marker, the revoke marker, not empty) or
// sqlstmt.ForceExpire (marker empty) on the row of key in one transaction:
// it locks the row, then changes it only if it is live and, for a revoke,
// not revoked yet. Its commit is confirmed (Confirmed).
func ChangeRow(ctx context.Context, db DB, t Table, key, marker string) (RowChange, error) {
	var c RowChange
	err := OnOneConnection(ctx, db, func(db DB) error {
		return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
			row, err := scanRow(tx.QueryRow(ctx, t.Render(sqlstmt.LockRow), key))
			if errors.Is(err, pgx.ErrNoRows) {
				return ErrNoRow
			}
			if err != nil {
				return err
			}
			c = RowChange{Before: row, ExpiresAt: row.ExpiresAt, ServerNow: row.ServerNow}
			if !row.Live() || marker != "" && row.HolderText() == marker {
				return nil
			}
			stmt, args := sqlstmt.ForceExpire, []any{key, row.Holder} // a NULL holder matched as NULL
			if marker != "" {
				stmt, args = sqlstmt.Revoke, append(args, marker)
			}
			var expires pgtype.Timestamptz // a revoke keeps an infinite expiry
			err = tx.QueryRow(ctx, t.Render(stmt), args...).Scan(&expires, &c.ServerNow)
			c.ExpiresAt, c.Changed = ServerTime(expires), err == nil
			return err
		})
	})
	return c, Confirmed(ctx, err) // the commit's too
}

// Run is a run of the ledger beside a lease table.
type Run struct {
	Key       string
	Tick      time.Time
	Fence     int64
	Holder    string
	StartedAt time.Time
	EndedAt   time.Time // zero while it runs, and when unknown
	Outcome   string
}

// ListRuns reads the runs of job (every job's when nil) started within
// since by the server's clock (sqlstmt.ListRuns).
func ListRuns(ctx context.Context, db DB, t Table, job *string, since time.Duration) ([]Run, error) {
	out := []Run{}
	err := OnOneConnection(ctx, db, func(db DB) error {
		rows, err := db.Query(ctx, t.Render(sqlstmt.ListRuns), job, since.Seconds())
		if err != nil {
			return err
		}
		defer rows.Close()
		for rows.Next() {
			var (
				r     Run
				ended pgtype.Timestamptz
				now   time.Time
			)
			if err := rows.Scan(&r.Key, &r.Tick, &r.Fence, &r.Holder, &r.StartedAt, &ended, &r.Outcome, &now); err != nil {
				return err
			}
			r.EndedAt = ServerTime(ended)
			out = append(out, r)
		}
		return rows.Err()
	})
	return out, err
}

// Purge deletes the rows of t expired longer ago than olderThan
// (sqlstmt.Purge) and returns how many, then the runs of its ledger
// started as long ago, if it has one, on one connection of db. The
// callers have checked the horizon against the least a purge may keep.
func Purge(ctx context.Context, db DB, t Table, olderThan time.Duration) (n int64, err error) {
	err = OnOneConnection(ctx, db, func(db DB) error {
		n, err = purge(ctx, db, t, olderThan)
		return err
	})
	return n, err
}

// purge is Purge on db as it is: Migrate's transaction.
func purge(ctx context.Context, db DB, t Table, olderThan time.Duration) (int64, error) {
	tag, err := db.Exec(ctx, t.Render(sqlstmt.Purge), olderThan.Seconds())
	if err := Confirmed(ctx, err); err != nil {
		return 0, err
	}
	var ledger bool
	if err := db.QueryRow(ctx, sqlstmt.HasRuns, sqlstmt.Runs(t.Name).Sanitize()).Scan(&ledger); err != nil {
		return 0, fmt.Errorf("looking for the ledger of runs: %w", err)
	}
	if ledger {
		_, err := db.Exec(ctx, t.Render(sqlstmt.PurgeRuns), olderThan.Seconds())
		if err := Confirmed(ctx, err); err != nil {
			return 0, fmt.Errorf("purging the ledger of runs: %w", err)
		}
	}
	return tag.RowsAffected(), nil
}
