package driver

import (
	"encoding/binary"
	"reflect"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// claimRow is Claimed as the row of a claim statement (sqlstmt.Claim)
// scans it: fence, acquired_at, expires_at, live, tableoid, and a column
// it skips. pgx builds a scan plan for each column of each statement's
// rows (seven allocations per claim); the binary form the extended
// protocol returns is decoded here in place instead, to the very values
// pgx would scan. Any other form (the text of the simple protocol,
// database/sql's values, a NULL, a time outside years 1 to 9999, a type
// map other than pgx's defaults: see pgxDefaults) goes through the row's
// own Scan, errors included.
type claimRow Claimed

// scanClaimed scans a claim statement's row: a row of the Locker's own
// connections scans itself (claimScanner), any other column by column (a
// DB the application wraps may scan in its own way). c's Holder is left
// to the caller.
func scanClaimed(row pgx.Row) (Claimed, error) {
	if r, ok := row.(claimScanner); ok {
		return r.scanClaim()
	}
	var c Claimed
	err := row.Scan(claimColumns(&c)...)
	return c, err
}

// claimColumns are the destinations in c of a claim row's columns, the
// last one skipped.
func claimColumns(c *Claimed) []any {
	return []any{&c.Fence, &c.AcquiredAt, &c.ExpiresAt, &c.Live, &c.Table, nil}
}

// claimScanner is a row that scans a claim statement's row itself
// (doneRow): through claimRow when it is pgx's own.
type claimScanner interface {
	scanClaim() (Claimed, error)
}

// ScanRow is pgx.RowScanner's.
func (c *claimRow) ScanRow(rows pgx.Rows) error {
	if pgxDefaults(rows.TypeMap()) && c.decode(rows.FieldDescriptions(), rows.RawValues()) {
		return nil
	}
	return rows.Scan(claimColumns((*Claimed)(c))...)
}

// claimRowTypes are the OIDs of a claim row's first five columns, each sent
// in binary.
var claimRowTypes = [5]uint32{pgtype.Int8OID, pgtype.TimestamptzOID, pgtype.TimestamptzOID, pgtype.BoolOID, pgtype.OIDOID}

// decode reads the row when every column it reads is binary, of its type
// and not NULL, and reports whether it did; it changes c only then.
func (c *claimRow) decode(fds []pgconn.FieldDescription, vals [][]byte) bool {
	if len(fds) != len(claimRowTypes)+1 || len(vals) != len(fds) {
		return false
	}
	for i, oid := range claimRowTypes {
		if fds[i].DataTypeOID != oid || fds[i].Format != pgtype.BinaryFormatCode || vals[i] == nil {
			return false
		}
	}
	if len(vals[0]) != 8 || len(vals[3]) != 1 || len(vals[4]) != 4 {
		return false
	}
	acquired, ok := timestamptzOf(vals[1])
	if !ok {
		return false
	}
	expires, ok := timestamptzOf(vals[2])
	if !ok {
		return false
	}
	c.Fence = int64(binary.BigEndian.Uint64(vals[0]))
	c.AcquiredAt, c.ExpiresAt = acquired, expires
	c.Live = vals[3][0] == 1 // as pgx reads it
	c.Table = binary.BigEndian.Uint32(vals[4])
	return true
}

// y2k is where PostgreSQL's binary timestamptz counts from, in seconds
// since the Unix epoch.
const y2k = 946_684_800

// pgxDefaults reports whether m scans a claim row's columns as pgx does by
// default: its own codecs for int8, bool and oid, a timestamptz in the
// local time zone (no ScanLocation), and no scan wrapper of the
// application's (TryWrapScanPlanFuncs, which may, say, scan every
// time.Time in UTC).
func pgxDefaults(m *pgtype.Map) bool {
	if m == nil {
		return false
	}
	if t, ok := m.TypeForOID(pgtype.TimestamptzOID); !ok {
		return false
	} else if codec, ok := t.Codec.(*pgtype.TimestamptzCodec); !ok || codec.ScanLocation != nil {
		return false
	}
	if t, ok := m.TypeForOID(pgtype.Int8OID); !ok || t.Codec != (pgtype.Int8Codec{}) {
		return false
	}
	if t, ok := m.TypeForOID(pgtype.BoolOID); !ok || t.Codec != (pgtype.BoolCodec{}) {
		return false
	}
	if t, ok := m.TypeForOID(pgtype.OIDOID); !ok || t.Codec != (pgtype.Uint32Codec{}) {
		return false
	}
	wraps, defaults := m.TryWrapScanPlanFuncs, defaultWraps()
	if len(wraps) != len(defaults) {
		return false
	}
	for i, f := range wraps {
		if reflect.ValueOf(f).Pointer() != defaults[i] {
			return false
		}
	}
	return true
}

// defaultWraps are the code pointers of the scan wrappers of pgx's default
// type map, in order.
var defaultWraps = sync.OnceValue(func() []uintptr {
	var out []uintptr
	for _, f := range pgtype.NewMap().TryWrapScanPlanFuncs {
		out = append(out, reflect.ValueOf(f).Pointer())
	}
	return out
})

// timestamptzOf is a binary timestamptz (microseconds since 2000-01-01
// UTC) as pgx scans it into a time.Time (local), when it is of years 1 to
// 9999; false otherwise (a wrong length, ±infinity, which pgx refuses).
func timestamptzOf(b []byte) (time.Time, bool) {
	if len(b) != 8 {
		return time.Time{}, false
	}
	us := int64(binary.BigEndian.Uint64(b))
	t := time.Unix(y2k+us/1_000_000, us%1_000_000*1_000)
	if y := t.Year(); y < 1 || y > 9999 {
		return time.Time{}, false
	}
	return t, true
}
