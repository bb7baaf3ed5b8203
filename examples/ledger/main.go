// Command ledger shows Lease.Guard fencing a job's writes to the database
// that holds the lease table. Replicas take turns on a few keys; every run
// appends to a ledger in a transaction that calls Guard last. Meanwhile the
// replicas are paused past their TTL in the middle of such a transaction:
// their connection stalls, as behind a frozen process (SIGSTOP, a GC pause,
// a VM freeze), and their Guard and COMMIT arrive after another replica
// took the key over.
//
// The summary proves, from the ledger alone, that no key's ledger holds a
// write of a lease committed after a later lease's first write, and that
// the paused replicas' late commits were refused.
//
//	go run ./examples/ledger [-for 15s] [-replicas 3] [-keys 4] [-ttl 1s] [-seed N] [-dsn URL]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"math/rand"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgserver"
)

func main() {
	code, err := run(context.Background(), os.Args[1:], os.Stdout)
	if errors.Is(err, flag.ErrHelp) {
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "ledger:", err)
	}
	os.Exit(code)
}

type config struct {
	dsn      string
	dur      time.Duration
	replicas int
	keys     int
	ttl      time.Duration
	seed     int64
}

// schema is the demo's ledger. A deferred constraint trigger numbers each
// row at COMMIT (seq), so the ledger's order is the order of the commits,
// and a commit that arrives late is numbered late.
const schema = `CREATE TABLE IF NOT EXISTS ledger (id bigserial PRIMARY KEY,
	key text NOT NULL, holder text NOT NULL, fence bigint NOT NULL, token text NOT NULL UNIQUE, seq bigint);
TRUNCATE ledger;
CREATE SEQUENCE IF NOT EXISTS ledger_commit;
CREATE OR REPLACE FUNCTION ledger_number() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	UPDATE ledger SET seq = nextval('ledger_commit') WHERE id = NEW.id;
	RETURN NULL;
END $$;
DROP TRIGGER IF EXISTS number_at_commit ON ledger;
CREATE CONSTRAINT TRIGGER number_at_commit AFTER INSERT ON ledger
	DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ledger_number()`

const insertSQL = `INSERT INTO ledger (key, holder, fence, token) VALUES ($1, $2, $3, $4)`

// attempt is one guarded transaction as its replica saw it end.
type attempt struct {
	token   string
	paused  bool // its replica was paused while it was open
	remote  bool // refused by the server's check, after arriving late
	outcome string
}

func run(ctx context.Context, args []string, out io.Writer) (int, error) {
	cfg := config{}
	fs := flag.NewFlagSet("ledger", flag.ContinueOnError)
	fs.StringVar(&cfg.dsn, "dsn", "", "PostgreSQL URL (default: PGLEASE_DATABASE_URL or a throwaway server)")
	fs.DurationVar(&cfg.dur, "for", 15*time.Second, "how long the replicas run")
	fs.IntVar(&cfg.replicas, "replicas", 3, "number of replicas")
	fs.IntVar(&cfg.keys, "keys", 4, "number of keys")
	fs.DurationVar(&cfg.ttl, "ttl", time.Second, "lease TTL")
	fs.Int64Var(&cfg.seed, "seed", 0, "seed of the pauses (0: from the clock)")
	if err := fs.Parse(args); err != nil {
		return 2, err
	}
	if cfg.seed == 0 {
		cfg.seed = time.Now().UnixNano()
	}

	dsn, closeDB, err := database(ctx, cfg.dsn)
	if err != nil {
		return 1, err
	}
	defer closeDB()
	pcfg, err := pgx.ParseConfig(dsn)
	if err != nil {
		return 1, err
	}
	admin, err := pgxpool.New(ctx, dsn)
	if err != nil {
		return 1, err
	}
	defer admin.Close()
	if err := pglease.Migrate(ctx, admin, pglease.WithTable("ledger_lease")); err != nil {
		return 1, err
	}
	if _, err := admin.Exec(ctx, schema+`; UPDATE ledger_lease SET expires_at = acquired_at + interval '1 microsecond' WHERE expires_at > clock_timestamp()`); err != nil {
		return 1, fmt.Errorf("ledger schema: %w", err)
	}
	fmt.Fprintf(out, "ledger: %d replicas, %d keys, TTL %v, %v, seed %d\n", cfg.replicas, cfg.keys, cfg.ttl, cfg.dur, cfg.seed)

	var (
		mu       sync.Mutex
		attempts []attempt
		tokens   int
	)
	rctx, stop := context.WithTimeout(ctx, cfg.dur)
	defer stop()
	proxies := make([]*faultproxy.Proxy, cfg.replicas)
	paused := make([]*pauseFlag, cfg.replicas)
	var wg sync.WaitGroup
	var closers []func() // run last first: Lockers, then pools, then proxies
	defer func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}()
	for r := range cfg.replicas {
		p, err := faultproxy.New(net.JoinHostPort(pcfg.Host, strconv.Itoa(int(pcfg.Port))))
		if err != nil {
			return 1, err
		}
		closers = append(closers, p.Close)
		proxies[r], paused[r] = p, &pauseFlag{}
		pc, err := pgxpool.ParseConfig(dsn)
		if err != nil {
			return 1, err
		}
		pc.ConnConfig.Host, pc.ConnConfig.Port = p.Host(), p.Port()
		pool, err := pgxpool.NewWithConfig(ctx, pc)
		if err != nil {
			return 1, err
		}
		closers = append(closers, pool.Close)
		l := pglease.NewLocker(pool, pglease.WithTable("ledger_lease"), pglease.WithHolder(fmt.Sprintf("replica-%d", r+1)),
			pglease.WithTTL(cfg.ttl), pglease.WithHeartbeatInterval(cfg.ttl/4), pglease.WithTimeout(cfg.ttl),
			pglease.WithLogger(slog.New(slog.DiscardHandler))) // the pauses make losses on purpose
		closers = append(closers, func() { _ = l.Close(context.WithoutCancel(ctx)) })
		rng := rand.New(rand.NewSource(cfg.seed + int64(r)))
		wg.Go(func() {
			for rctx.Err() == nil {
				lease, err := l.Lock(rctx, fmt.Sprintf("key-%d", rng.Intn(cfg.keys)))
				if err != nil {
					sleep(rctx, 20*time.Millisecond)
					continue
				}
				for range 3 {
					mu.Lock()
					tokens++
					a := attempt{token: fmt.Sprintf("r%d-%d", r+1, tokens)}
					mu.Unlock()
					since := paused[r].count()
					err := appendUnderGuard(rctx, pool, lease.(*pglease.Lease), a.token, time.Duration(50+rng.Intn(150))*time.Millisecond)
					a.paused = paused[r].count() != since || paused[r].now()
					switch {
					case err == nil:
						a.outcome = "committed"
					case errors.Is(err, pglease.ErrLost):
						a.outcome = "refused"
						a.remote = strings.Contains(err.Error(), "the server refused it")
					default:
						a.outcome = "failed"
					}
					mu.Lock()
					attempts = append(attempts, a)
					mu.Unlock()
					if err != nil {
						break
					}
				}
				_ = lease.Unlock(rctx)
			}
		})
	}

	// The pauses: one replica at a time, each longer than the TTL.
	rng := rand.New(rand.NewSource(cfg.seed))
	pauses := 0
	for rctx.Err() == nil {
		sleep(rctx, time.Duration(300+rng.Intn(700))*time.Millisecond)
		if rctx.Err() != nil {
			break
		}
		r := rng.Intn(cfg.replicas)
		pauses++
		paused[r].set(true)
		proxies[r].SetMode(faultproxy.Stall)
		sleep(context.WithoutCancel(rctx), cfg.ttl+time.Duration(rng.Intn(1000))*time.Millisecond)
		proxies[r].SetMode(faultproxy.Forward)
		paused[r].set(false)
	}
	wg.Wait()
	return summarize(ctx, admin, out, attempts, pauses)
}

// appendUnderGuard is one job run's write: the INSERT, some work, then
// Guard last and COMMIT.
func appendUnderGuard(ctx context.Context, db *pgxpool.Pool, lease *pglease.Lease, token string, work time.Duration) error {
	return pgx.BeginFunc(ctx, db, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, insertSQL, lease.Key(), lease.Holder(), lease.Fence(), token); err != nil {
			return err
		}
		sleep(ctx, work)
		return lease.Guard(ctx, tx)
	})
}

// summarize checks the ledger and prints the proof.
func summarize(ctx context.Context, db *pgxpool.Pool, out io.Writer, attempts []attempt, pauses int) (int, error) {
	rows, err := db.Query(ctx, `SELECT key, holder, fence, token FROM ledger ORDER BY seq`)
	if err != nil {
		return 1, err
	}
	type entry struct {
		key, holder, token string
		fence              int64
	}
	entries, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (entry, error) {
		var e entry
		return e, r.Scan(&e.key, &e.holder, &e.fence, &e.token)
	})
	if err != nil {
		return 1, err
	}
	written := map[string]bool{}
	top := map[string]int64{}
	leases := map[string]map[int64]bool{}
	var violations []string
	for _, e := range entries {
		written[e.token] = true
		if e.fence < top[e.key] {
			violations = append(violations, fmt.Sprintf("%s: fence %d (%s) committed after fence %d's first write", e.key, e.fence, e.holder, top[e.key]))
		}
		top[e.key] = max(top[e.key], e.fence)
		if leases[e.key] == nil {
			leases[e.key] = map[int64]bool{}
		}
		leases[e.key][e.fence] = true
	}
	var committed, refused, refusedPaused, failed int
	for _, a := range attempts {
		switch a.outcome {
		case "committed":
			committed++
			if !written[a.token] {
				violations = append(violations, fmt.Sprintf("transaction %s committed but left no row", a.token))
			}
		case "refused":
			refused++
			if a.paused && a.remote {
				refusedPaused++
			}
			if written[a.token] {
				violations = append(violations, fmt.Sprintf("transaction %s refused by Guard but its row is in the ledger", a.token))
			}
		default:
			failed++
		}
	}
	n := 0
	for _, m := range leases {
		n += len(m)
	}
	fmt.Fprintf(out, "ledger: %d rows from %d leases on %d keys; %d pauses past the TTL\n", len(entries), n, len(leases), pauses)
	fmt.Fprintf(out, "guarded transactions: %d committed, %d refused with ErrLost (%d of them late commits of a paused replica, refused by the server), %d failed otherwise\n",
		committed, refused, refusedPaused, failed)
	if len(violations) > 0 {
		fmt.Fprintf(out, "VIOLATIONS:\n  %s\n", strings.Join(violations, "\n  "))
		return 1, nil
	}
	fmt.Fprintln(out, "ok: per key, in commit order, no write under a fence comes after the first write under a greater one")
	if refusedPaused == 0 {
		fmt.Fprintln(out, "inconclusive: no paused replica's commit was refused in this run; run longer")
		return 1, nil
	}
	fmt.Fprintf(out, "ok: %d late commits of paused replicas were refused, and left nothing in the ledger\n", refusedPaused)
	return 0, nil
}

// pauseFlag tells whether a replica is paused now, and how many pauses it
// went through.
type pauseFlag struct {
	mu     sync.Mutex
	on     bool
	pauses int
}

func (p *pauseFlag) set(on bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on && !p.on {
		p.pauses++
	}
	p.on = on
}

func (p *pauseFlag) now() bool  { p.mu.Lock(); defer p.mu.Unlock(); return p.on }
func (p *pauseFlag) count() int { p.mu.Lock(); defer p.mu.Unlock(); return p.pauses }

func sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
	case <-ctx.Done():
	}
}

// database returns -dsn as given, otherwise PGLEASE_DATABASE_URL or a
// throwaway server started for the demo.
func database(ctx context.Context, dsn string) (string, func(), error) {
	if dsn != "" {
		return dsn, func() {}, nil
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{})
	if err != nil {
		return "", nil, err
	}
	return srv.DSN(), func() { _ = srv.Close() }, nil
}
