package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5/pgtype"

	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// Run is one run of a job with ticks (WithPeriod), as the ledger of runs
// beside the lease table records it: entered by the claim of its tick, and
// closed by the next.
type Run struct {
	Key       string
	Tick      time.Time
	Fence     int64
	Holder    string
	StartedAt time.Time // the server's time of its claim
	EndedAt   time.Time // zero while it runs, and when unknown
	// Outcome is running; completed (released by its holder); failed
	// (released by its holder, its task, Locker.Task, having returned an
	// error); lapsed
	// (expired without a release: its holder was killed, paused past its
	// TTL or cut off from the database, and the run may not have
	// finished); revoked (Revoke); superseded (its own holder claimed a
	// later tick while it ran); given back (its claim's outcome was unknown
	// or came past its trust window: no lease was handed out, nothing ran,
	// and the tick may be claimed again); unknown (a claim outside the
	// job's ticks took the row before the run was closed); or skipped (no
	// run: the replicas' claims of the tick found the run of an earlier
	// tick still holding the key; Holder is the first to find it so, and
	// Fence the lease that held the key).
	Outcome string
}

// noLedger says why a table WithoutFenceColumn lists no runs.
const noLedger = "a table WithoutFenceColumn has no ledger of runs: the tick of a job's last run is in its row's holder (List); run Migrate for the ledger"

// Runs returns the runs of the job key, or of every job when key is "",
// started within since of the server's clock, sorted by key byte-wise,
// then by tick. It needs SELECT on the lease table and its ledger, which
// Migrate makes: a table WithoutFenceColumn has none.
func (a *Admin) Runs(ctx context.Context, key string, since time.Duration) ([]Run, error) {
	mustContext(ctx, "Runs")
	t := a.table
	if since <= 0 {
		return nil, fmt.Errorf("pglease: runs of %s: since %v: must be positive", t, since)
	}
	if a.noFence {
		return nil, fmt.Errorf("pglease: runs of %s: %s", t, noLedger)
	}
	var job *string
	if key != "" {
		job = &key
	}
	out := []Run{}
	err := driver.OnOneConnection(ctx, a.db, func(db driver.DB) error {
		rows, err := db.Query(ctx, t.render(sqlstmt.ListRuns), job, since.Seconds())
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
			r.EndedAt = serverTime(ended)
			out = append(out, r)
		}
		return rows.Err()
	})
	if driver.Is(err, driver.UndefinedTable) {
		err = fmt.Errorf("%w (the ledger of runs, %s, is made by Migrate, beside the lease table; %s)", err, sqlstmt.Runs(t.name).Sanitize(), noLedger)
	}
	if err != nil {
		return nil, fmt.Errorf("pglease: runs of %s: %w", t, err)
	}
	return out, nil
}
