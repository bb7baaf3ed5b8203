package main

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/rawsql"
)

// pglease's statements, sent raw by the baselines (internal/rawsql).
// checkStatements refuses to run the study if a copy has drifted from what a
// Locker sends.
const (
	claimSQL     = rawsql.Claim
	releaseSQL   = rawsql.Release
	heartbeatSQL = rawsql.Heartbeat
)

// deleteReleaseSQL is the release of the DELETE design the storage study
// compares against: the row goes, and the next claim inserts a fresh one.
// It keeps the guard and the asynchronous commit of pglease's release, so
// that the two designs differ only in what they do to the table.
const deleteReleaseSQL = `DELETE FROM {table}
 WHERE key = $1 AND holder = $2 AND fence = $3
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// perLeaseHeartbeatSQL extends one lease with the batched heartbeat's
// guard: what a heartbeat without arrays sends once per lease.
const perLeaseHeartbeatSQL = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
 WHERE l.key = $3 AND l.holder = $1 AND l.fence = $4
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`

// seedLeasesSQL creates n live leases of one holder in one statement.
const seedLeasesSQL = `INSERT INTO {table} (key, holder, expires_at)
SELECT 'k' || g, $1, clock_timestamp() + interval '1 hour' FROM generate_series(1, $2::int) AS g
RETURNING key, fence`

// render fills a statement template for table the way pglease does.
func render(tmpl, table string) string { return rawsql.Render(tmpl, table) }

// recorder is a pgx tracer that keeps every statement text sent.
type recorder struct {
	mu   sync.Mutex
	sent map[string]bool
}

func (r *recorder) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.sent[data.SQL] = true
	return ctx
}

func (r *recorder) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// checkStatements runs a Locker through a claim, a heartbeat round and a
// release, and fails unless it sent exactly the statements copied above.
func checkStatements(ctx context.Context, dsn string) error {
	rec := &recorder{sent: map[string]bool{}}
	cfg, err := pgxpool.ParseConfig(dsn)
	if err != nil {
		return err
	}
	cfg.ConnConfig.Tracer = rec
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return err
	}
	defer pool.Close()
	const table = "bench_probe"
	if err := pglease.Migrate(ctx, pool, pglease.WithTable(table)); err != nil {
		return err
	}
	beat := make(chan struct{}, 1)
	l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithLogger(quiet),
		pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(20*time.Millisecond),
		pglease.WithHook(func(ev pglease.Event) {
			if ev.Kind == pglease.EventExtended {
				select {
				case beat <- struct{}{}:
				default:
				}
			}
		}))
	defer l.Close(ctx)
	lease, err := l.Claim(ctx, "probe")
	if err != nil {
		return err
	}
	select {
	case <-beat:
	case <-time.After(10 * time.Second):
		return fmt.Errorf("no heartbeat round within 10s")
	}
	if err := lease.Unlock(ctx); err != nil {
		return err
	}
	for name, tmpl := range map[string]string{"claim": claimSQL, "heartbeat": heartbeatSQL, "release": releaseSQL} {
		if !rec.sent[render(tmpl, table)] {
			return fmt.Errorf("the copy of pglease's %s statement in bench/sql.go differs from what a Locker sends; update it", name)
		}
	}
	return nil
}
