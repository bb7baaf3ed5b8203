package pglease

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
)

// forgeSep separates the replica's holder from the suffix forged for each
// mandate in WithoutFenceColumn mode.
const forgeSep = "#"

// unfencedClaimSQL is claimSQL for a table without a fence column.
//
//   - $2 is a holder identifier forged for this mandate alone: a late
//     heartbeat or release of an earlier mandate carries another one and
//     matches nothing.
//   - The conflict arm's first test keeps re-entrant claims working: a
//     replica may take back its own live lease, and only that. $4 is the
//     replica's holder and '#'; the row's holder must be exactly what
//     forge makes of it: that prefix, then forgeLen lowercase hex digits,
//     nothing more. A prefix test alone would take the live lease of a
//     replica of an older library whose plain holder merely starts the
//     same way ("host-1#worker"). The prefix is compared by equality, not
//     by LIKE or a regular expression, so that no character of a holder
//     acts as a pattern; COLLATE "C" makes the comparisons bytewise even
//     when the column has a case-insensitive collation.
//   - {acq} adds acquired_at when the table has it; its value is evaluated
//     before any wait on the row lock, as in claimSQL.
//   - The SELECT's WHERE raises synchronous_commit before anything is
//     written, as in claimSQL: an acknowledged claim survives a crash.
//   - The acquired time handed back is the proposed expiry minus the TTL:
//     the server's time when the row was proposed, known even when the
//     table has no acquired_at column. Release measures the min hold from it.
const unfencedClaimSQL = `INSERT INTO {table} AS lease (key, holder, expires_at{acq})
SELECT $1, $2, clock.t + make_interval(secs => $3){acqval}
  FROM (SELECT clock_timestamp() AS t) AS clock
 WHERE ` + raiseSyncCommitSQL + ` IS NOT NULL
ON CONFLICT (key) DO UPDATE
   SET holder     = EXCLUDED.holder,
       expires_at = EXCLUDED.expires_at{acqset}
 WHERE (length(lease.holder) = length($4::text) + 16
        AND left(lease.holder, length($4::text)) = $4::text COLLATE "C"
        AND right(lease.holder, 16) ~ '^[0-9a-f]{16}$' COLLATE "C")
    OR lease.expires_at <= clock_timestamp()
RETURNING expires_at - make_interval(secs => $3), expires_at, expires_at > clock_timestamp() AS live, tableoid`

// unfencedHeartbeatSQL is heartbeatSQL matching each row on its forged
// holder: it skips locked rows, never moves an expiry back and commits
// synchronously, for the same reasons, and extends each lease by its own
// TTL ($1, one per key). It does not read acquired_at, which the table may
// lack.
const unfencedHeartbeatSQL = `WITH h AS (
  SELECT * FROM unnest($2::text[], $3::text[], $1::float8[]) AS h(key, holder, ttl)
), mine AS (
  SELECT l.key, h.ttl FROM {table} AS l JOIN h ON l.key = h.key AND l.holder = h.holder COLLATE "C"
   WHERE l.expires_at > clock_timestamp()
     FOR NO KEY UPDATE OF l SKIP LOCKED
), extended AS (
  UPDATE {table} AS l
     SET expires_at = GREATEST(clock_timestamp() + make_interval(secs => mine.ttl), l.expires_at)
    FROM mine
   WHERE l.key = mine.key
     AND l.expires_at > clock_timestamp()
     AND ` + raiseSyncCommitSQL + ` IS NOT NULL
  RETURNING l.key, l.holder, l.expires_at
)
SELECT key, holder, expires_at FROM extended
UNION ALL
SELECT c.key, c.holder, NULL
  FROM h JOIN {table} AS c ON c.key = h.key AND c.holder = h.holder COLLATE "C"
 WHERE c.expires_at > clock_timestamp()
   AND c.key NOT IN (SELECT key FROM extended)
   AND (SELECT count(*) FROM extended) < cardinality($2::text[])`

// columnsSQL lists the table's columns, to check it has what this mode
// needs. to_regclass resolves the name as the statements will.
const columnsSQL = `SELECT a.attname, format_type(a.atttypid, a.atttypmod), a.atttypmod, a.attnotnull, a.atthasdef,
       EXISTS (SELECT 1 FROM pg_index i
                WHERE i.indrelid = a.attrelid AND i.indisunique AND i.indnkeyatts = 1
                  AND i.indkey[0] = a.attnum AND i.indpred IS NULL)
  FROM pg_attribute a
 WHERE a.attrelid = to_regclass($1) AND a.attnum > 0 AND NOT a.attisdropped`

// unfenced is the protocol of WithoutFenceColumn.
type unfenced struct {
	t       table
	replica string

	mu       sync.Mutex
	checked  bool
	claimSQL string // chosen once the table is checked
	hbSQL    string
	relSQL   string
}

func newUnfenced(t table, cfg config) *unfenced {
	return &unfenced{
		t:       t,
		replica: cfg.holder,
		hbSQL:   t.render(unfencedHeartbeatSQL),
		relSQL:  t.render(unfencedReleaseSQL),
	}
}

// forgeLen is the length of the suffix forge adds after forgeSep: 16
// lowercase hex digits, as unfencedClaimSQL checks.
const forgeLen = 16

// forge returns a holder identifier for one mandate.
func (p *unfenced) forge() string {
	var b [forgeLen / 2]byte
	_, _ = rand.Read(b[:])
	return p.replica + forgeSep + hex.EncodeToString(b[:])
}

func (p *unfenced) claim(ctx context.Context, db DB, key string, ttl time.Duration) (claimed, bool, error) {
	claimSQL, err := p.check(ctx, db)
	if err != nil {
		return claimed{}, false, err
	}
	c := claimed{holder: p.forge()}
	err = db.QueryRow(ctx, claimSQL, key, c.holder, ttl.Seconds(), p.replica+forgeSep).Scan(&c.acquiredAt, &c.expiresAt, &c.live, &c.table)
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	return c, err == nil, err
}

func (p *unfenced) extend(ctx context.Context, db DB, leases []*Lease) (map[*Lease]extension, error) {
	keys := make([]string, len(leases))
	holders := make([]string, len(leases))
	for i, ls := range leases {
		keys[i], holders[i] = ls.key, ls.holder
	}
	ttls := seconds(leases, func(t terms) time.Duration { return t.ttl })
	rows, err := db.Query(ctx, p.hbSQL, ttls, keys, holders)
	if err != nil {
		return nil, err
	}
	return readRound(rows, leases, func(ls *Lease, holder string) bool { return ls.holder == holder })
}

// check reads the table's columns once and returns the claim statement that
// fits them, or an error naming what the table lacks.
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
	hasAcquired, err := checkColumns(cols, len(p.forge()))
	if err != nil {
		return "", fmt.Errorf("table %s cannot be used WithoutFenceColumn: %w", p.t, err)
	}
	acq, acqval, acqset := "", "", ""
	if hasAcquired {
		acq, acqval, acqset = ", acquired_at", ", clock.t", ",\n       acquired_at = EXCLUDED.acquired_at"
	}
	p.claimSQL = strings.NewReplacer("{acq}", acq, "{acqval}", acqval, "{acqset}", acqset).Replace(p.t.render(unfencedClaimSQL))
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
	rows, err := db.Query(ctx, columnsSQL, t.name.Sanitize())
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
	key, ok := cols["key"]
	switch {
	case !ok:
		problems = append(problems, "no column key")
	case !textual(key.typ):
		problems = append(problems, fmt.Sprintf("column key is %s, not text", key.typ))
	case !key.unique:
		problems = append(problems, "column key has no unique index of its own (ON CONFLICT (key) needs one)")
	}
	holder, ok := cols["holder"]
	switch {
	case !ok:
		problems = append(problems, "no column holder")
	case !textual(holder.typ):
		problems = append(problems, fmt.Sprintf("column holder is %s, not text", holder.typ))
	case holder.typmod > 4 && int(holder.typmod-4) < holderLen:
		problems = append(problems, fmt.Sprintf("column holder is %s, too short for the %d-character holder identifiers of this replica", holder.typ, holderLen))
	}
	if exp, ok := cols["expires_at"]; !ok {
		problems = append(problems, "no column expires_at")
	} else if exp.typ != "timestamp with time zone" {
		problems = append(problems, fmt.Sprintf("column expires_at is %s, not timestamptz", exp.typ))
	}
	acq, hasAcquired := cols["acquired_at"]
	if hasAcquired && acq.typ != "timestamp with time zone" {
		problems = append(problems, fmt.Sprintf("column acquired_at is %s, not timestamptz", acq.typ))
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
