package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: a lease table works whatever its (valid) name. The statements
// name their own parts (WITH h, mine, extended, r, released, server), and an
// unqualified table of one of those names would be read as that part: the
// release of a table named "r" failed with "column l.holder does not
// exist". The bare names are refused with the way out; with its schema the
// table works through claim, heartbeat, release and listing.
func TestATableNamedLikeAPartOfTheStatementsIsRefusedBareAndWorksWithItsSchema(t *testing.T) {
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
			rows, err := adminOf(t, pool, pglease.WithTable(qualified)).List(ctx)
			require.NoError(t, err)
			require.Len(t, rows, 1)
			require.NoError(t, lease.Unlock(ctx))
		})
	}
}
