package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/sqlstmt"
)

// A release style of the storage study.
const (
	styleExpire = "expire in place" // pglease: Claim + Unlock, the row stays
	styleDelete = "delete"          // DELETE on release, fresh INSERT on claim
)

// tableStatsSQL reads what the storage study records about one table, and
// the WAL written since $2. The pg_stat_user_tables counters are published
// by each backend at most once a second; sample calls
// pg_stat_force_next_flush() first on the one connection that does all the
// work, so they are exact at each sample (vacuum publishes its own at once).
const tableStatsSQL = `SELECT pg_relation_size(s.relid), pg_indexes_size(s.relid),
       s.n_live_tup, s.n_dead_tup, s.n_tup_ins, s.n_tup_upd, s.n_tup_hot_upd, s.n_tup_del,
       s.vacuum_count, s.autovacuum_count,
       pg_wal_lsn_diff(pg_current_wal_lsn(), $2::pg_lsn)::bigint
  FROM pg_stat_user_tables AS s
 WHERE s.relid = $1::regclass`

// sample is the state of a study table after a number of cycles.
type sample struct {
	Cycle       int
	Elapsed     time.Duration // time spent in cycles so far, sampling excluded
	HeapBytes   int64         // pg_relation_size: the table's main fork
	IndexBytes  int64         // pg_indexes_size: its primary key index
	LiveTuples  int64
	DeadTuples  int64
	Inserts     int64
	Updates     int64
	HOTUpdates  int64
	Deletes     int64
	Vacuums     int64
	Autovacuums int64
	WALBytes    int64 // WAL written since the style's first cycle
}

// storageRun is one release style's study.
type storageRun struct {
	Style   string
	Keys    int
	Samples []sample
}

func (r storageRun) last() sample { return r.Samples[len(r.Samples)-1] }

// CyclesPerSecond is the rate of claim/release cycles, sampling excluded.
func (r storageRun) CyclesPerSecond() float64 {
	s := r.last()
	return float64(s.Cycle) / s.Elapsed.Seconds()
}

// MaxHeapBytes, MaxIndexBytes and MaxDeadTuples are the largest values
// seen at any sample.
func (r storageRun) MaxHeapBytes() int64 {
	return r.largest(func(s sample) int64 { return s.HeapBytes })
}

func (r storageRun) MaxIndexBytes() int64 {
	return r.largest(func(s sample) int64 { return s.IndexBytes })
}

func (r storageRun) MaxDeadTuples() int64 {
	return r.largest(func(s sample) int64 { return s.DeadTuples })
}

// largest is the largest value of field over the samples.
func (r storageRun) largest(field func(sample) int64) int64 {
	var m int64
	for _, s := range r.Samples {
		m = max(m, field(s))
	}
	return m
}

// HOTRatio is n_tup_hot_upd / n_tup_upd over the whole run.
func (r storageRun) HOTRatio() float64 {
	s := r.last()
	if s.Updates == 0 {
		return 0
	}
	return float64(s.HOTUpdates) / float64(s.Updates)
}

// WALPerCycle is the WAL written per cycle, autovacuum and checkpoints
// included: everything the server wrote while the style ran.
func (r storageRun) WALPerCycle() float64 {
	s := r.last()
	return float64(s.WALBytes) / float64(s.Cycle)
}

// study is one release style's table, connection and cycle.
type study struct {
	run     storageRun
	pool    *pgxpool.Pool
	table   string
	cycle   func(context.Context, string) error
	stop    func()
	elapsed time.Duration
	wal     int64
}

// studyStorage runs cycles claim/release cycles over keys keys, round
// robin, for each release style on a table of its own, and samples each
// table every 1% of the cycles. The styles take turns by blocks of 1%, so
// that the load of a shared machine weighs on both alike. Each style's
// statements all go through one connection, so that the statistics it
// flushes before each sample include every cycle so far. The WAL of a
// style is what the server wrote during its blocks, autovacuum and
// checkpoints included.
func studyStorage(ctx context.Context, dsn string, cycles, keys int, progress func(string)) ([]storageRun, error) {
	var studies []*study
	defer func() {
		for _, st := range studies {
			st.stop()
			st.pool.Close()
		}
	}()
	for _, style := range []string{styleExpire, styleDelete} {
		st, err := newStudy(ctx, dsn, style, keys)
		if err != nil {
			return nil, err
		}
		studies = append(studies, st)
		if err := st.sample(ctx, 0, ""); err != nil {
			return nil, err
		}
	}

	names := make([]string, keys)
	for k := range names {
		names[k] = fmt.Sprintf("job-%02d", k)
	}
	every := max(cycles/100, 1)
	for done := 0; done < cycles; {
		n := min(every, cycles-done)
		for _, st := range studies {
			var lsn string
			if err := st.pool.QueryRow(ctx, `SELECT pg_current_wal_lsn()::text`).Scan(&lsn); err != nil {
				return nil, err
			}
			start := time.Now()
			for i := range n {
				if err := st.cycle(ctx, names[(done+i)%keys]); err != nil {
					return nil, fmt.Errorf("%s cycle %d: %w", st.run.Style, done+i, err)
				}
			}
			st.elapsed += time.Since(start)
			if err := st.sample(ctx, done+n, lsn); err != nil {
				return nil, err
			}
		}
		done += n
		if progress != nil && done%(every*10) == 0 {
			for _, st := range studies {
				s := st.run.last()
				progress(fmt.Sprintf("%s: %d/%d cycles, table %d B, index %d B, %d dead tuples",
					st.run.Style, done, cycles, s.HeapBytes, s.IndexBytes, s.DeadTuples))
			}
		}
	}
	var runs []storageRun
	for _, st := range studies {
		runs = append(runs, st.run)
	}
	return runs, nil
}

func newStudy(ctx context.Context, dsn, style string, keys int) (*study, error) {
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return nil, err
	}
	cfg.MaxConns = 1
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, err
	}
	st := &study{run: storageRun{Style: style, Keys: keys}, pool: pool, table: "study_expire"}
	if style == styleDelete {
		st.table = "study_delete"
	}
	if err := pglease.Migrate(ctx, pool, pglease.WithTable(st.table)); err != nil {
		pool.Close()
		return nil, err
	}
	st.cycle, st.stop = expireCycle(pool, st.table)
	if style == styleDelete {
		st.cycle, st.stop = deleteCycle(pool, st.table)
	}
	return st, nil
}

// sample records the table after cycle cycles; blockLSN is the WAL position
// when the block of cycles just run started ("" for none).
func (st *study) sample(ctx context.Context, cycle int, blockLSN string) error {
	if _, err := st.pool.Exec(ctx, `SELECT pg_stat_force_next_flush()`); err != nil {
		return fmt.Errorf("flushing statistics (PostgreSQL 15 or newer is needed): %w", err)
	}
	if blockLSN == "" {
		blockLSN = "0/0"
	}
	s := sample{Cycle: cycle, Elapsed: st.elapsed}
	var wal int64
	err := st.pool.QueryRow(ctx, tableStatsSQL, pgx.Identifier{st.table}.Sanitize(), blockLSN).Scan(
		&s.HeapBytes, &s.IndexBytes, &s.LiveTuples, &s.DeadTuples, &s.Inserts, &s.Updates, &s.HOTUpdates,
		&s.Deletes, &s.Vacuums, &s.Autovacuums, &wal)
	if err != nil {
		return fmt.Errorf("sampling %s: %w", st.table, err)
	}
	if cycle > 0 {
		st.wal += wal
	}
	s.WALBytes = st.wal
	st.run.Samples = append(st.run.Samples, s)
	return nil
}

// expireCycle is pglease itself: Claim, then Unlock, which expires the row
// in place.
func expireCycle(pool *pgxpool.Pool, table string) (func(context.Context, string) error, func()) {
	l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder("study"), pglease.WithLogger(quiet))
	return func(ctx context.Context, key string) error {
			lease, err := l.Claim(ctx, key)
			if err != nil {
				return err
			}
			return lease.Unlock(ctx)
		}, func() {
			_ = l.Close(context.Background())
		}
}

// deleteCycle claims with pglease's claim statement (an INSERT, since the
// row is gone) and releases with deleteReleaseSQL.
func deleteCycle(pool *pgxpool.Pool, table string) (func(context.Context, string) error, func()) {
	claim, release := render(sqlstmt.Claim, table), render(deleteReleaseSQL, table)
	ttl := (60 * time.Second).Seconds() // a Locker's default TTL
	return func(ctx context.Context, key string) error {
		var (
			fence    int64
			acq, exp time.Time
			live     bool
		)
		err := pool.QueryRow(ctx, claim, key, "study", ttl).Scan(&fence, &acq, &exp, &live, new(uint32), nil)
		if errors.Is(err, pgx.ErrNoRows) || (err == nil && !live) {
			return fmt.Errorf("claim of %q not acquired", key)
		}
		if err != nil {
			return err
		}
		tag, err := pool.Exec(ctx, release, key, "study", fence)
		if err != nil {
			return err
		}
		if tag.RowsAffected() != 1 {
			return fmt.Errorf("release of %q fence %d deleted %d rows", key, fence, tag.RowsAffected())
		}
		return nil
	}, func() {}
}
