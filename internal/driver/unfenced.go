package driver

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// unfenced is the protocol of WithoutFenceColumn, on a table it cannot
// alter: each lease is matched on a holder identifier forged for it alone.
// Its statements are in internal/sqlstmt.
type unfenced struct {
	render        func(string) string
	table, quoted string
	tails         string
	forge         func() string

	mu       sync.Mutex
	checked  bool
	claimSQL string // chosen once the table is checked
	tickSQL  string
	tooShort error // set once checked if the holder column cannot take a tick
	hbSQL    string
	relSQL   string
	relQuiet string
}

// Unfenced is the protocol of WithoutFenceColumn on the table render
// names (table as given, quoted as SQL reads it), for the replica whose
// holder identifiers start with prefix; forge makes each lease's.
func Unfenced(render func(string) string, table, quoted, prefix string, forge func() string) Protocol {
	return &unfenced{
		render:   render,
		table:    table,
		quoted:   quoted,
		tails:    prefix,
		forge:    forge,
		hbSQL:    render(sqlstmt.UnfencedHeartbeat),
		relSQL:   render(sqlstmt.UnfencedRelease),
		relQuiet: render(sqlstmt.UnfencedReleaseQuiet),
	}
}

func (p *unfenced) Bursts() bool { return false }

// ClaimAll is not a statement of this protocol: its claims go one by one.
func (p *unfenced) ClaimAll(context.Context, DB, []string, []float64, time.Duration) (map[string]Claimed, error) {
	return nil, errors.New("pglease: a table without a fence column has no claim of many keys")
}

// ClaimTick claims the tick nearest the server's clock in the forged
// holder (sqlstmt.UnfencedClaimTick): the table has no tick column. A
// catch-up is not a claim of this protocol (Locker.Job refuses
// WithCatchUp WithoutFenceColumn).
func (p *unfenced) ClaimTick(ctx context.Context, db DB, key string, ttl, lockWait time.Duration, tk Ticks) (TickClaim, error) {
	if _, err := p.check(ctx, db); err != nil {
		return TickClaim{}, err
	}
	p.mu.Lock()
	tickSQL, tooShort := p.tickSQL, p.tooShort
	p.mu.Unlock()
	if tooShort != nil {
		return TickClaim{}, NotSentError(tooShort)
	}
	if !tk.CatchUp.IsZero() {
		return TickClaim{}, NotSentError(errors.New("pglease: a table without a fence column has no catch-up: it cannot tell a released run from a lapsed one"))
	}
	var wait *string
	if lockWait > 0 {
		w := fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))
		wait = &w
	}
	var period *int64
	if tk.Period > 0 {
		us := tk.Period.Microseconds()
		period = &us
	}
	return retried(ctx, func() (TickClaim, error) {
		var (
			c       TickClaim
			rowTick *string
		)
		err := db.QueryRow(ctx, tickSQL, key, p.forge(), ttl.Seconds(), period, wait, nil, tk.Instants).
			Scan(&c.Took, &c.Holder, &c.AcquiredAt, &c.ExpiresAt, &c.Live, &c.Table, &c.Tick, &rowTick)
		if errors.Is(err, pgx.ErrNoRows) {
			return TickClaim{}, nil // no row: the claim's snapshot did not see the one that refused it
		}
		if err == nil && rowTick != nil {
			if c.RowTick, err = time.Parse(sqlstmt.TickLayout, *rowTick); err != nil {
				err = fmt.Errorf("reading the tick of the row's holder %q: %w", c.Holder, err)
			}
		}
		c.Stale = err == nil && !c.Took && c.Tick.Unix() == 0
		return c, err
	})
}

// Claim waits on the row's lock at most lockWait when it is not zero
// (sqlstmt.UnfencedClaim's $5).
func (p *unfenced) Claim(ctx context.Context, db DB, key string, ttl, lockWait time.Duration) (Claimed, bool, error) {
	claimSQL, err := p.check(ctx, db)
	if err != nil {
		return Claimed{}, false, err
	}
	var wait *string
	if lockWait > 0 {
		w := fmt.Sprintf("%dms", max(lockWait.Milliseconds(), 1))
		wait = &w
	}
	type result struct {
		c  Claimed
		ok bool
	}
	r, err := retried(ctx, func() (result, error) {
		c := Claimed{Holder: p.forge()}
		err := db.QueryRow(ctx, claimSQL, key, c.Holder, ttl.Seconds(), p.tails, wait).Scan(&c.AcquiredAt, &c.ExpiresAt, &c.Live, &c.Table, nil)
		c, ok, err := claimOutcomeOf(c, err)
		return result{c, ok}, err
	})
	return r.c, r.ok, err
}

func (p *unfenced) Extend(ctx context.Context, db DB, ms []Lease) (map[int]Extension, error) {
	return retried(ctx, func() (map[int]Extension, error) {
		keys, holders := keysAnd(ms, holderOf)
		rows, err := db.Query(ctx, p.hbSQL, seconds(ms, ttlOf), keys, holders)
		if err != nil {
			return nil, err
		}
		return extensions(readReport(rows, ms, holderOf, heartbeatFields))
	})
}

// Release measures each lease's min hold from the acquired time its claim
// returned (a server time), since the table may have no acquired_at column.
func (p *unfenced) Release(ctx context.Context, db DB, ms []Lease) (map[int]bool, error) {
	return retried(ctx, func() (map[int]bool, error) {
		keys, holders := keysAnd(ms, holderOf)
		acquired := make([]time.Time, len(ms))
		for i, m := range ms {
			acquired[i] = m.AcquiredAt
		}
		return releaseReported(ctx, db, p.relSQL, p.relQuiet, ms, holderOf,
			seconds(ms, minHoldOf), keys, holders, acquired, ReleaseLockWait)
	})
}

// ReleaseOne is Release of one lease: this protocol has one release
// statement.
func (p *unfenced) ReleaseOne(ctx context.Context, db DB, m Lease) (map[int]bool, error) {
	return p.Release(ctx, db, []Lease{m})
}

// ReadRow: a row's forged holder does not say whether this Locker handed
// that lease out, so nothing is given back on it.
func (p *unfenced) ReadRow(context.Context, DB, string, time.Duration) (RowLease, error) {
	return RowLease{}, errors.New("pglease: a table without a fence column has no lease to read")
}

// check reads the table's columns once and returns the claim statement that
// fits them, or an error naming what the table lacks.
func (p *unfenced) check(ctx context.Context, db DB) (string, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.checked {
		return p.claimSQL, nil
	}
	cols, err := readColumns(ctx, db, p.quoted)
	if err != nil {
		return "", fmt.Errorf("checking table %s: %w", p.table, err)
	}
	if len(cols) == 0 {
		return "", fmt.Errorf("table %s does not exist (WithoutFenceColumn uses an existing table; it never creates one)", p.table)
	}
	holderLen := utf8.RuneCountInString(p.forge()) // varchar(n) counts characters
	hasAcquired, err := checkColumns(cols, holderLen)
	if err != nil {
		return "", fmt.Errorf("table %s cannot be used WithoutFenceColumn: %w", p.table, err)
	}
	if h := cols["holder"]; h.typmod > 4 && int(h.typmod-4) < holderLen+sqlstmt.TickSuffixLen {
		p.tooShort = fmt.Errorf("table %s cannot hold the ticks of a job (WithPeriod, WithCron) WithoutFenceColumn: column holder is %s, "+
			"too short for the %d-character holders of a job of ticks (this replica's %d-character holder, '@' and the tick, %d more): "+
			"give the holder column %d characters or more, or this replica a shorter WithHolder", p.table, h.typ,
			holderLen+sqlstmt.TickSuffixLen, holderLen, sqlstmt.TickSuffixLen, holderLen+sqlstmt.TickSuffixLen)
	}
	p.claimSQL = p.render(sqlstmt.UnfencedClaimFor(hasAcquired))
	p.tickSQL = p.render(sqlstmt.UnfencedClaimTickFor(hasAcquired))
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

func readColumns(ctx context.Context, db DB, quoted string) (map[string]column, error) {
	rows, err := db.Query(ctx, sqlstmt.Columns, quoted)
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
	// The expiry columns' types are the table check's (sqlstmt.TableCheck,
	// in both modes, before any claim): a timestamptz of full precision,
	// or a domain over one. Here they need only be there.
	need("expires_at", "timestamptz", anyType)
	_, hasAcquired = cols["acquired_at"]
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

func anyType(string) bool { return true }
