package driver

import (
	"math"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
)

// claimFields are the columns of a claim statement's row as the extended
// protocol describes them: each in binary, the last one skipped.
func claimFields() []pgconn.FieldDescription {
	fds := make([]pgconn.FieldDescription, 0, 6)
	for _, oid := range claimRowTypes {
		fds = append(fds, pgconn.FieldDescription{DataTypeOID: oid, Format: pgtype.BinaryFormatCode})
	}
	return append(fds, pgconn.FieldDescription{DataTypeOID: pgtype.TextOID, Format: pgtype.BinaryFormatCode})
}

// claimValues encodes one claim row in binary with pgx's own codecs.
func claimValues(t *testing.T, m *pgtype.Map, fence int64, acquired, expires any, live bool, table uint32) [][]byte {
	t.Helper()
	vals := make([][]byte, 0, 6)
	for i, v := range []any{fence, acquired, expires, live, table} {
		b, err := m.Encode(claimRowTypes[i], pgtype.BinaryFormatCode, v, nil)
		if err != nil {
			t.Fatalf("encoding column %d (%v): %v", i, v, err)
		}
		vals = append(vals, b)
	}
	return append(vals, []byte("on"))
}

// TestClaimRow checks, with no server, that a claim row decoded in place
// holds exactly what pgx's own Scan reads from the same bytes (the same
// instants, in the same location), and that any row it does not decode is
// left to that Scan, c unchanged.
func TestClaimRow(t *testing.T) {
	t.Parallel()
	at := func(s string) time.Time {
		tm, err := time.Parse(time.RFC3339Nano, s)
		if err != nil {
			t.Fatal(err)
		}
		return tm
	}
	for _, tc := range []struct {
		name              string
		fence             int64
		acquired, expires time.Time
		live              bool
	}{
		{"a lease of today", 7, at("2026-12-05T12:00:00.123456Z"), at("2026-12-05T12:00:30.123456Z"), true},
		{"an expired one", math.MaxInt64, at("2026-12-05T12:00:00Z"), at("2026-12-05T12:00:00.000001Z"), false},
		{"before 2000, a fraction of a second", 1, at("1999-12-31T23:59:59.999999Z"), at("1969-07-20T20:17:40.5Z"), true},
		{"the first and last years pgx scans", 2, at("0001-01-01T00:00:00Z"), at("9999-12-31T23:59:59.999999Z"), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			m := pgtype.NewMap() // a Map is not safe for concurrent use
			vals := claimValues(t, m, tc.fence, tc.acquired, tc.expires, tc.live, 16384)
			var got claimRow
			if !got.decode(claimFields(), vals) {
				t.Fatal("a binary claim row was not decoded")
			}
			var want Claimed
			if err := pgx.ScanRow(m, claimFields(), vals, &want.Fence, &want.AcquiredAt, &want.ExpiresAt, &want.Live, &want.Table, nil); err != nil {
				t.Fatal(err)
			}
			if Claimed(got) != want {
				t.Errorf("decoded %+v, pgx scans %+v", Claimed(got), want)
			}
			if !got.AcquiredAt.Equal(tc.acquired) || !got.ExpiresAt.Equal(tc.expires) || got.Fence != tc.fence || got.Live != tc.live || got.Table != 16384 {
				t.Errorf("decoded %+v from %+v", Claimed(got), tc)
			}
		})
	}

	t.Run("a bool byte other than 0 and 1", func(t *testing.T) {
		t.Parallel()
		m := pgtype.NewMap()
		vals := claimValues(t, m, 5, at("2026-12-05T12:00:00Z"), at("2026-12-05T12:01:00Z"), true, 1)
		vals[3] = []byte{2}
		var got claimRow
		var want Claimed
		err := pgx.ScanRow(m, claimFields(), vals, &want.Fence, &want.AcquiredAt, &want.ExpiresAt, &want.Live, &want.Table, nil)
		if !got.decode(claimFields(), vals) || err != nil || Claimed(got) != want {
			t.Errorf("decoded %+v, pgx scans %+v (%v)", Claimed(got), want, err)
		}
	})

	now := time.Now()
	type rows = func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte)
	as := func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
		return fds, vals
	}
	for _, tc := range []struct {
		name    string
		expires any // the expiry encoded
		edit    rows
	}{
		{"an infinite expiry", pgtype.Timestamptz{Valid: true, InfinityModifier: pgtype.Infinity}, as},
		{"a year past 9999", time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC), as},
		{"a NULL fence", now, func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			vals[0] = nil
			return fds, vals
		}},
		{"text (the simple protocol)", now, func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			fds[1].Format = pgtype.TextFormatCode
			return fds, vals
		}},
		{"another type", now, func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			fds[0].DataTypeOID = pgtype.Int4OID
			return fds, vals
		}},
		{"a short value", now, func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			vals[2] = vals[2][:7]
			return fds, vals
		}},
		{"a column fewer", now, func(fds []pgconn.FieldDescription, vals [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			return fds[:5], vals[:5]
		}},
		{"no values (database/sql's rows)", now, func(fds []pgconn.FieldDescription, _ [][]byte) ([]pgconn.FieldDescription, [][]byte) {
			return fds, nil
		}},
	} {
		t.Run("left to Scan: "+tc.name, func(t *testing.T) {
			t.Parallel()
			m := pgtype.NewMap() // a Map is not safe for concurrent use
			fds, vals := tc.edit(claimFields(), claimValues(t, m, 3, now.Add(-time.Minute), tc.expires, true, 2))
			got := claimRow{Holder: "h", Fence: -1}
			if got.decode(fds, vals) {
				t.Fatalf("decoded %+v", Claimed(got))
			}
			if got != (claimRow{Holder: "h", Fence: -1}) {
				t.Errorf("a row left to Scan changed the claim: %+v", Claimed(got))
			}
		})
	}
}

// TestPgxDefaults checks, with no server, that a claim row is decoded in
// place only on a type map that scans its columns as pgx does by default.
func TestPgxDefaults(t *testing.T) {
	t.Parallel()
	if !pgxDefaults(pgtype.NewMap()) {
		t.Error("pgx's default type map is not taken for the default")
	}
	for name, change := range map[string]func(m *pgtype.Map){
		"times scanned in UTC by the codec": func(m *pgtype.Map) {
			m.RegisterType(&pgtype.Type{Name: "timestamptz", OID: pgtype.TimestamptzOID, Codec: &pgtype.TimestamptzCodec{ScanLocation: time.UTC}})
		},
		"a scan wrapper of the application's first": func(m *pgtype.Map) {
			m.TryWrapScanPlanFuncs = append([]pgtype.TryWrapScanPlanFunc{func(any) (pgtype.WrappedScanPlanNextSetter, any, bool) {
				return nil, nil, false
			}}, m.TryWrapScanPlanFuncs...)
		},
		"a scan wrapper fewer": func(m *pgtype.Map) { m.TryWrapScanPlanFuncs = m.TryWrapScanPlanFuncs[1:] },
		"another codec for int8": func(m *pgtype.Map) {
			m.RegisterType(&pgtype.Type{Name: "int8", OID: pgtype.Int8OID, Codec: pgtype.NumericCodec{}})
		},
		"another codec for bool": func(m *pgtype.Map) {
			m.RegisterType(&pgtype.Type{Name: "bool", OID: pgtype.BoolOID, Codec: pgtype.TextCodec{}})
		},
		"another codec for oid": func(m *pgtype.Map) {
			m.RegisterType(&pgtype.Type{Name: "oid", OID: pgtype.OIDOID, Codec: pgtype.Int8Codec{}})
		},
	} {
		m := pgtype.NewMap()
		change(m)
		if pgxDefaults(m) {
			t.Errorf("a type map with %s is taken for the default", name)
		}
	}
	if pgxDefaults(nil) {
		t.Error("no type map is taken for the default")
	}
}
