package pglease_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestTable pins that a lease table works whatever its valid name and
// however it is partitioned.
func TestTable(t *testing.T) { //nolint:tparallel // NamedLikeAPartOfTheStatements runs alone: it creates tables of bare names in public
	// Guarantee: a lease table works whatever its (valid) name. The statements
	// name their own parts (WITH h, mine, extended, r, released, server), and an
	// unqualified table of one of those names would be read as that part: the
	// release of a table named "r" failed with "column l.holder does not
	// exist". The bare names are refused with the way out; with its schema the
	// table works through claim, heartbeat, release and listing.
	t.Run("NamedLikeAPartOfTheStatements", func(t *testing.T) {
		ctx, pool, _ := pgtest.Setup(t)
		for _, name := range []string{"h", "mine", "extended", "r", "released", "server"} {
			t.Run(name, func(t *testing.T) {
				err := pglease.Migrate(ctx, pool, pglease.WithTable(name))
				require.ErrorIs(t, err, pglease.ErrInvalidOption)
				require.ErrorContains(t, err, "give it with its schema (public."+name+")")

				qualified := "public." + name
				require.NoError(t, pglease.Migrate(ctx, pool, pglease.WithTable(qualified)))
				t.Cleanup(func() {
					_, _ = pool.Exec(ctx, `DROP TABLE IF EXISTS public.`+name+`; DROP SEQUENCE IF EXISTS public.`+name+`_fence_seq`)
				})
				events := pgtest.NewEvents(t)
				l := pgtest.Locker(t, pool, qualified, "replica", pglease.WithTTL(time.Second),
					pglease.WithHeartbeatInterval(50*time.Millisecond), pglease.WithHook(events.Hook))
				lease, err := l.Claim(ctx, "k")
				require.NoError(t, err)
				events.WaitFor(t, pglease.EventExtended, 5*time.Second)
				rows, err := pglease.List(ctx, pool, pglease.WithTable(qualified))
				require.NoError(t, err)
				require.Len(t, rows, 1)
				require.NoError(t, lease.Unlock(ctx))
			})
		}
	})

	// Guarantee: Guard matches the table the claim wrote to. A user who
	// partitions the lease table by key (hash) gets the partition's oid from
	// the claim's RETURNING tableoid; Guard, the heartbeat and the release must
	// keep working on such a table, since a row never changes partition.
	t.Run("PartitionedByKey", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		pool := pgtest.Pool(t, nil)
		name := pgtest.Name("lease_part")
		tbl, seq := pgx.Identifier{name}.Sanitize(), pgx.Identifier{name + "_fence_seq"}.Sanitize()
		_, err := pool.Exec(ctx, fmt.Sprintf(`CREATE SEQUENCE %[2]s AS bigint;
CREATE TABLE %[1]s (
    key text PRIMARY KEY, holder text NOT NULL,
    fence bigint NOT NULL DEFAULT nextval('%[2]s'),
    acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    expires_at timestamptz NOT NULL, CHECK (expires_at > acquired_at)) PARTITION BY HASH (key);
CREATE TABLE %[3]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 0);
CREATE TABLE %[4]s PARTITION OF %[1]s FOR VALUES WITH (MODULUS 2, REMAINDER 1);`,
			tbl, seq, pgx.Identifier{name + "_p0"}.Sanitize(), pgx.Identifier{name + "_p1"}.Sanitize()))
		require.NoError(t, err)

		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, name, "p", pglease.WithTTL(2*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond), pglease.WithHook(events.Hook))
		for _, k := range []string{"a", "b", "c", "d"} {
			lease, err := l.Claim(ctx, k)
			require.NoError(t, err)
			tx, err := pool.Begin(ctx)
			require.NoError(t, err)
			require.NoError(t, lease.Guard(ctx, tx), "Guard on a partitioned table, key %s", k)
			require.NoError(t, tx.Rollback(ctx))
		}
		for range 3 {
			events.WaitFor(t, pglease.EventExtended, 2*time.Second)
		}
		require.Zero(t, events.Count(pglease.EventLost))
		require.NoError(t, l.Close(ctx))
		require.Equal(t, 4, events.Count(pglease.EventReleased))
	})
}
