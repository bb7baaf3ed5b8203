package main

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// Heartbeat styles compared for one round over every lease a Locker holds.
const (
	beatBatched     = "batched (pglease, 1 statement)"
	beatPerLease    = "one UPDATE per lease"
	beatPerLeaseTx  = "one UPDATE per lease, one transaction"
	heartbeatHolder = "replica"
)

// beatPoint is the median cost of one heartbeat round at one size.
type beatPoint struct {
	Style      string
	Leases     int
	Statements int // statements sent per round
	Round      time.Duration
	Rounds     int // rounds measured
}

// studyHeartbeat measures a heartbeat round for each size and style, each
// on its own table of n live leases. The batched round is pglease's
// heartbeat statement; the per-lease rounds send one UPDATE per lease, as
// separate commits (what a naive heartbeat does) or in one transaction.
func studyHeartbeat(ctx context.Context, pool *pgxpool.Pool, sizes []int, reps int) ([]beatPoint, error) {
	var out []beatPoint
	for _, n := range sizes {
		table := fmt.Sprintf("beat_%d", n)
		if err := pglease.Migrate(ctx, pool, pglease.WithTable(table)); err != nil {
			return nil, err
		}
		keys, fences, err := seed(ctx, pool, table, n)
		if err != nil {
			return nil, err
		}
		batched := render(sqlstmt.Heartbeat, table)
		single := render(sqlstmt.BaselinePerLeaseHeartbeat, table)
		styles := []struct {
			name  string
			stmts int
			round func() error
		}{
			{beatBatched, 1, func() error { return beatBatch(ctx, pool, batched, keys, fences) }},
			{beatPerLease, n, func() error { return beatEach(ctx, pool, single, keys, fences) }},
			{beatPerLeaseTx, n, func() error {
				return pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error { return beatEach(ctx, tx, single, keys, fences) })
			}},
		}
		// Each repetition runs every style once, in turn, so that the load
		// of a shared machine weighs on all of them alike.
		times := make([][]time.Duration, len(styles))
		for rep := -1; rep < repsFor(n, reps); rep++ {
			for i, st := range styles {
				start := time.Now()
				if err := st.round(); err != nil {
					return nil, fmt.Errorf("%s, %d leases: %w", st.name, n, err)
				}
				if rep >= 0 { // rep -1 prepares the statements
					times[i] = append(times[i], time.Since(start))
				}
			}
		}
		for i, st := range styles {
			slices.Sort(times[i])
			out = append(out, beatPoint{Style: st.name, Leases: n, Statements: st.stmts, Round: times[i][len(times[i])/2], Rounds: len(times[i])})
		}
	}
	return out, nil
}

// repsFor is how many rounds of each style to time at n leases: more where
// a round is short and noise weighs most.
func repsFor(n, reps int) int {
	switch {
	case n <= 100:
		return reps * 5
	case n <= 1000:
		return reps * 2
	}
	return reps
}

type querier interface {
	Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error)
	QueryRow(ctx context.Context, sql string, args ...any) pgx.Row
}

// beatBatch extends every lease in one statement, as pglease does.
func beatBatch(ctx context.Context, db querier, sql string, keys []string, fences []int64) error {
	rows, err := db.Query(ctx, sql, heartbeatHolder, make60(len(keys)), keys, fences)
	if err != nil {
		return err
	}
	n := 0
	for rows.Next() {
		n++
	}
	if err := rows.Err(); err != nil {
		return err
	}
	if n != len(keys) {
		return fmt.Errorf("extended %d of %d leases", n, len(keys))
	}
	return nil
}

// beatEach extends the leases one statement at a time.
func beatEach(ctx context.Context, db querier, sql string, keys []string, fences []int64) error {
	for i := range keys {
		var (
			key   string
			fence int64
			exp   time.Time
		)
		if err := db.QueryRow(ctx, sql, heartbeatHolder, 60.0, keys[i], fences[i]).Scan(&key, &fence, &exp); err != nil {
			return fmt.Errorf("extending %s: %w", keys[i], err)
		}
	}
	return nil
}

// seed creates n live leases of heartbeatHolder in table.
func seed(ctx context.Context, pool *pgxpool.Pool, table string, n int) ([]string, []int64, error) {
	rows, err := pool.Query(ctx, render(sqlstmt.SeedLeases, table), heartbeatHolder, n)
	if err != nil {
		return nil, nil, err
	}
	var (
		keys   []string
		fences []int64
	)
	for rows.Next() {
		var (
			key   string
			fence int64
		)
		if err := rows.Scan(&key, &fence); err != nil {
			return nil, nil, err
		}
		keys, fences = append(keys, key), append(fences, fence)
	}
	return keys, fences, rows.Err()
}

// make60 is a TTL of 60s for each of n leases, as the heartbeat takes them.
func make60(n int) []float64 {
	out := make([]float64, n)
	for i := range out {
		out[i] = 60
	}
	return out
}
