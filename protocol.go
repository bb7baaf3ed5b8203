package pglease

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/driver"
)

// protocol is the SQL a Locker speaks to its lease rows; every SQL text of
// the library (these, and the admin, migration, Guard and LISTEN
// statements) is a constant of internal/sqlstmt. The default, fenced
// (fenced.go), runs the fenced statements: a fence column fed by a
// sequence. unfenced
// (WithoutFenceColumn) works on a table it cannot alter, with a holder
// identifier forged per mandate instead of a fence.
//
// Every method is one statement and one round trip.
type protocol interface {
	// claim takes key for ttl; ok is false when another holder's lease is
	// live.
	claim(ctx context.Context, db DB, key string, ttl time.Duration) (c claimed, ok bool, err error)
	// extend runs one heartbeat round, each lease extended by its own TTL,
	// and reports on each lease whose row
	// still matched: extended to a new server expiry, or locked by another
	// transaction and to be retried. The others are lost.
	extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error)
	// release expires the rows of leases in one statement, each kept for
	// its own min hold, and reports on
	// each lease whose row still matched: released (true), or locked by
	// another transaction and to be sent again (false). The others were
	// lost.
	release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error)
	// mandate reads the mandate key's row carries now, for a give-back
	// (Locker.giveBackUnknown); the protocol without a fence column has
	// none to tell.
	mandate(ctx context.Context, db DB, key string) (rowMandate, error)
}

// rowMandate is the mandate a row carries.
type rowMandate struct {
	holder string
	fence  int64
	live   bool
}

// claimed is what a claim statement returned.
type claimed struct {
	holder     string
	fence      int64
	acquiredAt time.Time
	expiresAt  time.Time
	live       bool
	table      uint32 // the oid of the table the row is in, for Guard
}

// claimOutcomeOf is what the Scan of a claim statement's row says: no row
// means another holder's lease is live.
func claimOutcomeOf(c claimed, err error) (claimed, bool, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	return c, err == nil, err
}

// extension is what a heartbeat round found for one lease. A lease the
// round reports nothing for is lost.
type extension struct {
	expiresAt time.Time // the new server expiry, if extended
	locked    bool      // not extended: the row is locked by another transaction, and still matched as last committed
	serverNow time.Time // the server's clock as the statement ran, for the clock-skew reading
}

// seconds is each lease's TTL or min hold in seconds, as make_interval
// takes them: the array a heartbeat or release statement carries beside
// the keys, so that one statement serves leases of every TTL (Locker.Job).
func seconds(leases []*Lease, of func(terms) time.Duration) []float64 {
	out := make([]float64, len(leases))
	for i, ls := range leases {
		out[i] = of(ls.terms).Seconds()
	}
	return out
}

func ttlOf(t terms) time.Duration     { return t.ttl }
func minHoldOf(t terms) time.Duration { return t.minHold }

// mandates is each lease's key and mandate (its fence, or its forged
// holder WithoutFenceColumn): the arrays a heartbeat or release statement
// matches rows on.
func mandates[M any](leases []*Lease, mandate func(*Lease) M) ([]string, []M) {
	keys := make([]string, len(leases))
	ms := make([]M, len(leases))
	for i, ls := range leases {
		keys[i], ms[i] = ls.key, mandate(ls)
	}
	return keys, ms
}

// readReport reads what a heartbeat or release statement reported, one row
// per lease whose row still matched: its key, its mandate, and what the
// statement did to it (V, read into the columns fields gives: the new
// expiry or NULL when skipped because locked, and the server's clock;
// released or skipped). A row counts only for the lease of that key and
// that very mandate. A lease reported neither way is left out: it is lost.
func readReport[M comparable, V any](rows pgx.Rows, leases []*Lease, mandate func(*Lease) M, fields func(*V) []any) (map[*Lease]V, error) {
	defer rows.Close()
	byKey := make(map[string]*Lease, len(leases))
	for _, ls := range leases {
		byKey[ls.key] = ls
	}
	got := make(map[*Lease]V, len(leases))
	for rows.Next() {
		var (
			key  string
			m    M
			what V
		)
		if err := rows.Scan(append([]any{&key, &m}, fields(&what)...)...); err != nil {
			return nil, err
		}
		if ls := byKey[key]; ls != nil && mandate(ls) == m {
			got[ls] = what
		}
	}
	return got, rows.Err()
}

// releaseReported sends sql, a release statement of leases, and reads its
// report (readReport). A statement whose rows came back and whose commit
// then failed with 55P03 (its lock wait passed while the commit waited for
// the notification queue's lock: nothing was released) is sent again at
// once as quiet, the same statement without its notification. A 55P03
// before any row (a lock on the table past the wait) reports every lease
// skipped, to be sent again later.
func releaseReported[M comparable](ctx context.Context, db DB, sql, quiet string, leases []*Lease, mandate func(*Lease) M, args ...any) (map[*Lease]bool, error) {
	send := func(sql string) (map[*Lease]bool, error) {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return readReport(rows, leases, mandate, releaseFields)
	}
	got, err := send(sql)
	if driver.Is(err, driver.LockNotAvailable) && len(got) > 0 {
		got, err = send(quiet)
	}
	if driver.Is(err, driver.LockNotAvailable) {
		got = make(map[*Lease]bool, len(leases))
		for _, ls := range leases {
			got[ls] = false
		}
		return got, nil
	}
	return got, err
}

// heartbeatRow is what a heartbeat statement reports on one lease: its new
// expiry, or NULL when its row was skipped because locked, and the
// server's clock.
type heartbeatRow struct {
	expiresAt *time.Time
	now       time.Time
}

func heartbeatFields(r *heartbeatRow) []any { return []any{&r.expiresAt, &r.now} }

// releaseFields reads whether a release statement released the row (true)
// or skipped it because locked (false).
func releaseFields(released *bool) []any { return []any{released} }

// extensions is a heartbeat statement's report (readReport) as
// extensions.
func extensions(got map[*Lease]heartbeatRow, err error) (map[*Lease]extension, error) {
	if err != nil {
		return nil, err
	}
	out := make(map[*Lease]extension, len(got))
	for ls, r := range got {
		if r.expiresAt == nil {
			out[ls] = extension{locked: true, serverNow: r.now}
		} else {
			out[ls] = extension{expiresAt: *r.expiresAt, serverNow: r.now}
		}
	}
	return out, nil
}
