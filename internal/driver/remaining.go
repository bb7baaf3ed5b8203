package driver

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// ErrNoLease is Remaining's error when the key has no row.
var ErrNoLease = errors.New("no row for the key")

// Remaining reads the holder of key in t and the time its lease has left
// on the server's clock (sqlstmt.Remaining), at most most: a row pinned
// far away (an expiry in the year 9999, or infinity) would overflow a
// Duration into a negative one. A key with no row is ErrNoLease.
func Remaining(ctx context.Context, db DB, t Table, key string, most time.Duration) (string, time.Duration, error) {
	var (
		holder string
		secs   float64
	)
	err := db.QueryRow(ctx, t.Render(sqlstmt.Remaining), key).Scan(&holder, &secs)
	if errors.Is(err, pgx.ErrNoRows) {
		return "", 0, ErrNoLease
	}
	if err != nil {
		return "", 0, err
	}
	return holder, time.Duration(min(secs, most.Seconds()) * float64(time.Second)), nil
}
