package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// pglease's statements, copied from locker.go, lock.go and heartbeat.go so
// that the baselines can send them raw. checkStatements refuses to run the
// study if a copy has drifted from what a Locker sends.
const (
	claimSQL = `INSERT INTO {table} AS lease (key, holder, expires_at)
VALUES ($1, $2, clock_timestamp() + make_interval(secs => $3))
ON CONFLICT (key) DO UPDATE
   SET holder      = EXCLUDED.holder,
       expires_at  = EXCLUDED.expires_at,
       acquired_at = EXCLUDED.acquired_at,
       fence       = nextval({seqlit})
 WHERE lease.holder = EXCLUDED.holder OR lease.expires_at <= clock_timestamp()
RETURNING fence, acquired_at, expires_at, expires_at > clock_timestamp() AS live`

	releaseSQL = `UPDATE {table}
   SET expires_at = GREATEST(clock_timestamp(), acquired_at + make_interval(secs => $4))
 WHERE key = $1 AND holder = $2 AND fence = $3 AND expires_at > clock_timestamp()
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

	heartbeatSQL = `UPDATE {table} AS l
   SET expires_at = clock_timestamp() + make_interval(secs => $2)
  FROM unnest($3::text[], $4::bigint[]) AS h(key, fence)
 WHERE l.key = h.key AND l.holder = $1 AND l.fence = h.fence
   AND l.expires_at > clock_timestamp()
RETURNING l.key, l.fence, l.expires_at`
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
func render(tmpl, table string) string {
	seq := pgx.Identifier{table + "_fence_seq"}.Sanitize()
	return strings.NewReplacer(
		"{table}", pgx.Identifier{table}.Sanitize(),
		"{seqlit}", "'"+strings.ReplaceAll(seq, "'", "''")+"'",
	).Replace(tmpl)
}

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
