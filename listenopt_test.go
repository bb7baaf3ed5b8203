package pglease_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestWithListenDSN pins the option that gives a Locker a connection of its
// own to LISTEN on: refused at New when it cannot be used, and a waiter
// woken by notification whatever the DB (TestPgBouncer runs it behind a
// pooler).
func TestWithListenDSN(t *testing.T) {
	t.Parallel()

	t.Run("RefusesADSNThatDoesNotParse", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		for _, dsn := range []string{"", "  ", "postgres://u:secret@host:notaport/db", "host=h port=x"} {
			_, err := pglease.New(pool, pglease.WithListenDSN(dsn))
			require.ErrorIs(t, err, pglease.ErrInvalidOption, "%q", dsn)
			var oe *pglease.OptionError
			require.ErrorAs(t, err, &oe)
			require.Equal(t, "WithListenDSN", oe.Option)
			require.Contains(t, err.Error(), "WithListenDSN")
			require.NotContains(t, err.Error(), "secret", "the password is not repeated")
		}
	})

	t.Run("ListensOnItsOwnConnectionWhateverTheDB", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		for name, db := range map[string]pglease.DB{"wrapper": pgtest.NewFaultyDB(pool), "conn": conn} {
			key := "job-" + name
			holder := pgtest.Locker(t, pool, table, "holder-"+name)
			waiter := pgtest.Locker(t, db, table, "waiter-"+name, pglease.WithListenDSN(pgtest.Server.DSN()))
			held, err := holder.Claim(ctx, key)
			require.NoError(t, err)
			got := claimWaitAsync(ctx, waiter, key)
			require.Eventually(t, func() bool { m, _ := waiter.WaitMode(); return m == pglease.WaitByNotification },
				10*time.Second, 2*time.Millisecond, "%s: waiting by notification", name)
			pid := pglease.ListenerPID(waiter)
			require.NotZero(t, pid)
			if c, ok := db.(*pgx.Conn); ok {
				require.NotEqual(t, c.PgConn().PID(), pid, "a connection of its own")
			}
			require.NoError(t, held.Unlock(ctx))
			// The default TTL and a safety net of 2.5s or more: only the
			// notification wakes it this soon.
			r := receive(t, got, 2*time.Second)
			require.NoError(t, r.err, name)
			require.NoError(t, r.lease.Unlock(ctx))

			require.NoError(t, waiter.Close(ctx))
			require.Eventually(t, func() bool {
				var n int
				err := pool.QueryRow(ctx, `SELECT count(*) FROM pg_stat_activity WHERE pid = $1`, int32(pid)).Scan(&n)
				return err == nil && n == 0
			}, 5*time.Second, 10*time.Millisecond, "%s: Close closes the listening connection", name)
		}
	})

	t.Run("PollsWhileItsConnectionCannotBeHad", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		events := pgtest.NewEvents(t)
		holder := pgtest.Locker(t, pool, table, "holder")
		waiter := pgtest.Locker(t, pool, table, "waiter", pglease.WithHook(events.Hook),
			pglease.WithListenDSN("postgres://nobody@127.0.0.1:1/none?connect_timeout=1"))
		held, got := holdAndWait(ctx, t, holder, waiter)
		ev := events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		for !errorContains(ev.Err, "dialing") {
			ev = events.WaitFor(t, pglease.EventWaitByPolling, 10*time.Second)
		}
		require.Contains(t, ev.Err.Error(), "WithListenDSN (127.0.0.1:1)", "names the option and where it dials")
		require.Contains(t, ev.Err.Error(), "each waiting key tried about once per", "says what polling costs")
		mode, reason := waiter.WaitMode()
		require.Equal(t, pglease.WaitByPolling, mode)
		require.Contains(t, reason, "WithListenDSN")
		require.Zero(t, pglease.ListenerPID(waiter), "the pool lends it no connection instead")
		require.NoError(t, held.Unlock(ctx))
		require.NoError(t, receive(t, got, 5*time.Second).err, "woken by polling")
	})
}

func errorContains(err error, s string) bool {
	return err != nil && strings.Contains(err.Error(), s)
}
