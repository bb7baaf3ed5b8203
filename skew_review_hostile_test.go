package pglease_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: a heartbeat round's clock-skew sample is the server's clock as
// the round ran, whatever the rows' expiries: a row whose expiry is beyond
// now + TTL without any clock step (an operator extended it by an hour
// before a deploy) must not make the Locker report the server an hour ahead
// and warn of a skew that does not exist.
func TestHeartbeatSkewIgnoresAnExpiryTheRoundDidNotMove(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	events := pgtest.NewEvents(t)
	l := pgtest.Locker(t, pool, table, "a", pglease.WithTTL(3*time.Second), pglease.WithHook(events.Hook))

	_, err := l.Claim(ctx, "k")
	require.NoError(t, err)
	_, err = pool.Exec(context.Background(), fmt.Sprintf(`UPDATE %s SET expires_at = expires_at + interval '1 hour' WHERE key = 'k'`,
		pgx.Identifier{table}.Sanitize()))
	require.NoError(t, err)

	require.Eventually(t, func() bool {
		for _, e := range events.All() {
			if e.Kind == pglease.EventExtended && !e.Skew.At.IsZero() && e.Leases == 1 {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	skew, ok := l.ClockSkew()
	require.True(t, ok)
	require.Less(t, skew.Beyond(), time.Second, "the reading says the server is %v ahead (± %v); its clock never moved", skew.Offset, skew.Uncertainty)
}
