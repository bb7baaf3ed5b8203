package pglease_test

import (
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee 4 (WithKeptConnection keeps one pooled connection for
// the heartbeat and so makes it more reliable, not less): the kept
// connection idles a full interval between rounds and is used without the
// liveness check pgxpool gives a connection idle for over a second. A
// server-side idle_session_timeout (or a firewall or pooler that drops idle
// connections) shorter than the heartbeat interval then closes it between
// every two rounds, and every full round fails; the same Locker without the
// kept connection never fails a round. Worse, Unlock and Close run on the
// kept connection when it is free: after such an idle spell they fail, and
// the released keys stay held until their expiry.
func TestKeptConnectionIdledPastTheServerTimeoutFailsNoRoundAndNoRelease(t *testing.T) {
	t.Parallel()
	for _, kept := range []bool{false, true} {
		name := "pool"
		if kept {
			name = "kept"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			ctx := pgtest.Ctx(t)
			table := pgtest.Table(t, pgtest.Pool(t, nil))
			pool := pgtest.PoolWith(t, pgtest.Server.DSN(), func(cfg *pgxpool.Config) {
				cfg.ConnConfig.RuntimeParams["idle_session_timeout"] = "1200"
				cfg.MaxConns = 4
			})

			events := pgtest.NewEvents(t)
			opts := []pglease.Option{pglease.WithTTL(6 * time.Second), pglease.WithHeartbeatInterval(2500 * time.Millisecond), pglease.WithHook(events.Hook)}
			if kept {
				opts = append(opts, pglease.WithKeptConnection())
			}
			l := pgtest.Locker(t, pool, table, "a", opts...)
			unlocked, err := l.Claim(ctx, "unlocked")
			require.NoError(t, err)
			_, err = l.Claim(ctx, "closed")
			require.NoError(t, err)
			for range 2 {
				events.WaitFor(t, pglease.EventExtended, 5*time.Second)
			}
			// Releases run on the kept connection too: one sent after it
			// idled past the timeout, between two rounds, fails, and the
			// key stays held until its expiry.
			time.Sleep(1600 * time.Millisecond) // the point: the connection idles past idle_session_timeout, before the next round (2.5s)
			uerr := unlocked.Unlock(ctx)
			events.WaitFor(t, pglease.EventExtended, 5*time.Second)
			time.Sleep(1600 * time.Millisecond) // idle past the timeout again, now before Close's release
			cerr := l.Close(ctx)
			var failure error
			for _, ev := range events.All() {
				if ev.Kind == pglease.EventHeartbeatFailed && failure == nil {
					failure = ev.Err
				}
			}
			assert.NoError(t, uerr, "Unlock after the kept connection idled")
			assert.NoError(t, cerr, "Close after the kept connection idled")
			for _, key := range []string{"unlocked", "closed"} {
				row, _ := pgtest.ReadRow(t, pool, table, key)
				assert.False(t, row.Live, "row %q still held until its expiry after its release", key)
			}
			assert.Zero(t, events.Count(pglease.EventHeartbeatFailed), "failed heartbeat rounds; first: %v", failure)
		})
	}
}
