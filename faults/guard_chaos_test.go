package faults_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

var (
	guardChaosFor  = flag.Duration("guardchaos", 15*time.Second, "how long TestGuardChaos runs")
	guardChaosSeed = flag.Int64("guardchaos.seed", 0, "seed of TestGuardChaos's faults (0: from the clock)")
)

// guardTx is one guarded transaction attempted by a job run, as the job saw
// it end.
type guardTx struct {
	token   string
	key     string
	fence   int64
	outcome string // committed, refused (Guard: ErrLost), failed (anything else)
	remote  bool   // refused by the server, not by the lease's local state
}

// guardIncarnation is one life of one replica: a pool through the replica's
// proxy, a Locker, and the workers running jobs with it.
type guardIncarnation struct {
	pool    *pgxpool.Pool
	locker  *pglease.Locker
	cancel  context.CancelFunc
	workers sync.WaitGroup
}

// TestGuardChaos checks that no key's ledger has a write of an older
// mandate after a newer one. It runs 4 replicas, 3 workers each, on 20
// keys. Every job run claims a key and appends to a ledger in a
// transaction that calls Guard last, after some work. Meanwhile the replicas' proxies stall past the TTL (a paused
// process: its heartbeat and its Guard arrive late), reset every
// connection, and replicas crash and restart with a new holder. Checked
// offline: in every key's ledger, in commit order, fences never go down;
// every transaction refused by Guard left no row; every transaction that
// committed left its row.
func TestGuardChaos(t *testing.T) {
	t.Parallel()
	const (
		replicas = 4
		workers  = 3
		keys     = 20
		ttl      = time.Second
		interval = 250 * time.Millisecond
	)
	seed := *guardChaosSeed
	if seed == 0 {
		seed = time.Now().UnixNano()
	}
	t.Logf("guard chaos seed %d (replay with -guardchaos.seed=%d), duration %v", seed, seed, *guardChaosFor)
	rng := rand.New(rand.NewSource(seed))

	admin := pgtest.Pool(t, nil)
	table := pgtest.Table(t, admin)
	ledger, insert := pgtest.NewCommitOrderedLedger(t, admin)

	var (
		mu      sync.Mutex
		txs     []guardTx
		tokenNo int
	)
	record := func(tx guardTx) {
		mu.Lock()
		txs = append(txs, tx)
		mu.Unlock()
	}
	nextToken := func() string {
		mu.Lock()
		defer mu.Unlock()
		tokenNo++
		return fmt.Sprintf("t%d", tokenNo)
	}

	// job claims a key, works a little, then writes under Guard.
	job := func(ctx context.Context, l *pglease.Locker, pool *pgxpool.Pool, wr *rand.Rand) {
		key := fmt.Sprintf("k%d", wr.Intn(keys))
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		lease, err := l.Claim(cctx, key)
		cancel()
		if err != nil {
			return
		}
		defer func() {
			uctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = lease.Unlock(uctx)
			cancel()
		}()
		for range 1 + wr.Intn(3) {
			g := guardTx{token: nextToken(), key: key, fence: lease.Fence()}
			work := time.Duration(wr.Intn(300)) * time.Millisecond
			err := pgx.BeginFunc(ctx, pool, func(tx pgx.Tx) error {
				if _, err := tx.Exec(ctx, insert, key, lease.Holder(), lease.Fence(), g.token); err != nil {
					return err
				}
				select {
				case <-time.After(work):
				case <-ctx.Done():
					return ctx.Err()
				}
				if err := lease.Guard(ctx, tx); err != nil {
					if errors.Is(err, pglease.ErrLost) {
						g.outcome = "refused"
						g.remote = strings.Contains(err.Error(), "the server refused it")
					}
					return err
				}
				return nil
			})
			switch {
			case err == nil:
				g.outcome = "committed"
			case g.outcome == "":
				g.outcome = "failed"
			}
			record(g)
			if err != nil {
				return
			}
		}
	}

	proxies := make([]*faultproxy.Proxy, replicas)
	current := make([]*guardIncarnation, replicas)
	gens := make([]int, replicas)
	start := func(r int) {
		gens[r]++
		pool := pgtest.AppPool(t, "", proxies[r], pgtest.AppName("guardchaos"))
		l := pglease.NewLocker(pool, pglease.WithTable(table), pglease.WithHolder(fmt.Sprintf("r%d-g%d", r, gens[r])),
			pglease.WithTTL(ttl), pglease.WithHeartbeatInterval(interval), pglease.WithLogger(pgtest.Quiet))
		ctx, cancel := context.WithCancel(context.Background())
		inc := &guardIncarnation{pool: pool, locker: l, cancel: cancel}
		for w := range workers {
			wr := rand.New(rand.NewSource(seed + int64(r*100+w+gens[r]*10000)))
			inc.workers.Go(func() {
				for ctx.Err() == nil {
					job(ctx, l, pool, wr)
					select {
					case <-time.After(time.Duration(5+wr.Intn(30)) * time.Millisecond):
					case <-ctx.Done():
					}
				}
			})
		}
		current[r] = inc
	}
	stop := func(r int) {
		inc := current[r]
		inc.cancel()
		inc.workers.Wait()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = inc.locker.Close(ctx)
		cancel()
		inc.pool.Close()
	}
	for r := range replicas {
		proxies[r] = pgtest.Proxy(t, "")
		start(r)
	}

	faults := map[string]int{}
	deadline := time.Now().Add(*guardChaosFor)
	for time.Now().Before(deadline) {
		r := rng.Intn(replicas)
		switch f := rng.Intn(10); {
		case f < 6: // a pause past the TTL
			faults["stall"]++
			proxies[r].SetMode(faultproxy.Stall)
			time.Sleep(ttl + time.Duration(rng.Intn(1500))*time.Millisecond) // the fault's length, not a wait for an outcome
			proxies[r].SetMode(faultproxy.Forward)
		case f < 8:
			faults["reset"]++
			proxies[r].ResetAll()
		default: // crash: no release reaches the server, then a new process
			faults["crash"]++
			proxies[r].Stop()
			stop(r)
			require.NoError(t, proxies[r].Start())
			start(r)
		}
		time.Sleep(time.Duration(100+rng.Intn(400)) * time.Millisecond) // spacing between faults
	}
	for r := range replicas {
		stop(r)
	}

	// Offline checks.
	rows := pgtest.ReadLedgerTokens(t, admin, ledger)
	written := map[string]bool{}
	last := map[string]int64{}
	for _, e := range rows {
		written[e.Token] = true
		require.GreaterOrEqual(t, e.Fence, last[e.Key],
			"key %s: a write of fence %d (committed %d-th) after a write of fence %d", e.Key, e.Fence, e.ID, last[e.Key])
		last[e.Key] = e.Fence
	}
	count := map[string]int{}
	remote := 0
	for _, g := range txs {
		count[g.outcome]++
		switch g.outcome {
		case "committed":
			assert.True(t, written[g.token], "committed transaction %s left no row", g.token)
		case "refused":
			assert.False(t, written[g.token], "transaction %s refused by Guard left a row", g.token)
			if g.remote {
				remote++
			}
		}
	}
	t.Logf("figures: seed %d, %v, faults %v, %d ledger rows, %d transactions: %d committed, %d refused by Guard (%d by the server after a late arrival, %d locally), %d failed otherwise",
		seed, *guardChaosFor, faults, len(rows), len(txs), count["committed"], count["refused"], remote, count["refused"]-remote, count["failed"])
	require.Positive(t, count["committed"])
	require.Positive(t, remote, "no Guard arrived late at the server: the run proved nothing about the server-side check")
}
