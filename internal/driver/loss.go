package driver

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// lostReadTimeout bounds the read that tells a revoked lease from one a
// later lease took: the loss is not declared before it returns, so a
// server that has just answered the statement that found the row gone, and
// then stalls, delays the loss by this much at most.
const lostReadTimeout = 250 * time.Millisecond

// LostRow is the row of a key whose lease a heartbeat round, a release or
// a Guard found gone, as it stands now.
type LostRow struct {
	Holder    string // empty when NULL
	Fence     *int64 // nil without a fence column
	ExpiresAt time.Time
	Live      bool
}

// LostRows reads the rows of keys (sqlstmt.LostRows) within
// lostReadTimeout; a key with no row is absent from the result, and any
// failure returns what was read before it with the error.
func LostRows(ctx context.Context, db DB, t Table, keys []string) (map[string]LostRow, error) {
	ctx, cancel := context.WithTimeout(ctx, lostReadTimeout)
	defer cancel()
	found := make(map[string]LostRow)
	rows, err := db.Query(ctx, t.Render(sqlstmt.LostRows), keys)
	if err != nil {
		return found, err
	}
	defer rows.Close()
	for rows.Next() {
		var (
			key string
			r   LostRow
		)
		if err := rows.Scan(&key, &r.Holder, &r.Fence, &r.ExpiresAt, &r.Live); err != nil {
			return found, err
		}
		found[key] = r
	}
	return found, rows.Err()
}
