package pglease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// forgeSep separates the replica's holder from the suffix forged for each
// mandate in WithoutFenceColumn mode.
const forgeSep = "#"

// unfenced is the protocol of WithoutFenceColumn, on a table it cannot
// alter: each mandate is matched on a holder identifier forged for it
// alone. Its statements are in internal/sqlstmt.
type unfenced struct {
	t       table
	replica string

	mu       sync.Mutex
	checked  bool
	claimSQL string // chosen once the table is checked
	hbSQL    string
	relSQL   string
	relQuiet string
}

func newUnfenced(t table, cfg config) *unfenced {
	return &unfenced{
		t:        t,
		replica:  cfg.holder,
		hbSQL:    t.render(sqlstmt.UnfencedHeartbeat),
		relSQL:   t.render(sqlstmt.UnfencedRelease),
		relQuiet: t.render(sqlstmt.UnfencedReleaseQuiet),
	}
}

// holderOf is the mandate of a lease of this protocol.
func holderOf(ls *Lease) string { return ls.holder }

// forge returns a holder identifier for one mandate: the Locker's holder,
// forgeSep and a random suffix (suffixLen lowercase hex digits, as
// sqlstmt.UnfencedClaim checks).
func (p *unfenced) forge() string { return p.replica + forgeSep + randomSuffix() }

func (p *unfenced) claim(ctx context.Context, db DB, key string, ttl time.Duration) (claimed, bool, error) {
	return p.claimWithin(ctx, db, key, ttl, 0)
}

// claimWithin is claim waiting on the row's lock at most lockWait (when
// not zero; sqlstmt.UnfencedClaim's $5), for a claim that may not wait
// without bound (claimBound.mayWait).
func (p *unfenced) claimWithin(ctx context.Context, db DB, key string, ttl, lockWait time.Duration) (claimed, bool, error) {
	claimSQL, err := p.check(ctx, db)
	if err != nil {
		return claimed{}, false, err
	}
	var wait *string
	if lockWait > 0 {
		w := fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))
		wait = &w
	}
	c := claimed{holder: p.forge()}
	err = db.QueryRow(ctx, claimSQL, key, c.holder, ttl.Seconds(), p.replica+forgeSep, wait).Scan(&c.acquiredAt, &c.expiresAt, &c.live, &c.table, nil)
	return claimOutcomeOf(c, err)
}

func (p *unfenced) extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error) {
	keys, holders := mandates(leases, holderOf)
	rows, err := db.Query(ctx, p.hbSQL, seconds(leases, ttlOf), keys, holders)
	if err != nil {
		return nil, err
	}
	return extensions(readReport(rows, leases, holderOf, heartbeatFields))
}

// release measures each lease's min hold from the acquired time its claim
// returned (a server time), since the table may have no acquired_at column.
func (p *unfenced) release(ctx context.Context, db DB, leases []*Lease) (map[*Lease]bool, error) {
	keys, holders := mandates(leases, holderOf)
	acquired := make([]time.Time, len(leases))
	for i, ls := range leases {
		acquired[i] = ls.acquiredAt
	}
	return releaseReported(ctx, db, p.relSQL, p.relQuiet, leases, holderOf,
		seconds(leases, minHoldOf), keys, holders, acquired, releaseLockWait)
}

// check reads the table's columns once and returns the claim statement that
// fits them, or an error naming what the table lacks.
// mandate: a row's forged holder does not say whether this Locker handed
// that mandate out, so nothing is given back on it.
func (p *unfenced) mandate(context.Context, DB, string) (rowMandate, error) {
	return rowMandate{}, errors.New("pglease: a table without a fence column has no mandate to read")
}

func (p *unfenced) check(ctx context.Context, db DB) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checked {
		return p.claimSQL, nil
	}
	cols, err := readColumns(ctx, db, p.t)
	if err != nil {
		return "", fmt.Errorf("checking table %s: %w", p.t, err)
	}
	if len(cols) == 0 {
		return "", fmt.Errorf("table %s does not exist (WithoutFenceColumn uses an existing table; it never creates one)", p.t)
	}
	hasAcquired, err := checkColumns(cols, utf8.RuneCountInString(p.forge())) // varchar(n) counts characters
	if err != nil {
		return "", fmt.Errorf("table %s cannot be used WithoutFenceColumn: %w", p.t, err)
	}
	p.claimSQL = p.t.render(sqlstmt.UnfencedClaimFor(hasAcquired))
	p.checked = true
	return p.claimSQL, nil
}

type column struct {
	typ        string
	typmod     int32
	notNull    bool
	hasDefault bool
	unique     bool
}

func readColumns(ctx context.Context, db DB, t table) (map[string]column, error) {
	rows, err := db.Query(ctx, sqlstmt.Columns, t.name.Sanitize())
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	cols := map[string]column{}
	for rows.Next() {
		var name string
		var c column
		if err := rows.Scan(&name, &c.typ, &c.typmod, &c.notNull, &c.hasDefault, &c.unique); err != nil {
			return nil, err
		}
		cols[name] = c
	}
	return cols, rows.Err()
}

// checkColumns says what the table lacks for this mode, if anything, and
// whether it has acquired_at.
func checkColumns(cols map[string]column, holderLen int) (hasAcquired bool, err error) {
	var problems []string
	// need reads the column name, which must exist with a type that
	// isType accepts (want names it); false when it recorded a problem.
	need := func(name, want string, isType func(string) bool) (column, bool) {
		c, ok := cols[name]
		switch {
		case !ok:
			problems = append(problems, "no column "+name)
		case !isType(c.typ):
			problems = append(problems, fmt.Sprintf("column %s is %s, not %s", name, c.typ, want))
		default:
			return c, true
		}
		return c, false
	}
	if key, ok := need("key", "text", textual); ok && !key.unique {
		problems = append(problems, "column key has no unique index of its own (ON CONFLICT (key) needs one)")
	}
	if holder, ok := need("holder", "text", textual); ok && holder.typmod > 4 && int(holder.typmod-4) < holderLen {
		problems = append(problems, fmt.Sprintf("column holder is %s, too short for the %d-character holder identifiers of this replica", holder.typ, holderLen))
	}
	need("expires_at", "timestamptz", timestamptz)
	if _, hasAcquired = cols["acquired_at"]; hasAcquired {
		need("acquired_at", "timestamptz", timestamptz)
	}
	for name, c := range cols {
		switch name {
		case "key", "holder", "expires_at", "acquired_at":
			continue
		}
		if c.notNull && !c.hasDefault {
			problems = append(problems, fmt.Sprintf("column %s is NOT NULL without a default, and this mode writes only key, holder, expires_at and acquired_at", name))
		}
	}
	if len(problems) > 0 {
		return false, errors.New(strings.Join(problems, "; "))
	}
	return hasAcquired, nil
}

func textual(typ string) bool {
	return typ == "text" || strings.HasPrefix(typ, "character varying")
}

func timestamptz(typ string) bool { return typ == "timestamp with time zone" }
