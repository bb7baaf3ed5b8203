package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// NewElector refuses WithMinHold, so that Close hands leadership over at
// once: the min hold is given several times, before and after other
// options, and every time the Elector is refused, naming it, before it
// could claim anything.
func TestElectorRefusesMinHoldWhereverItIsGiven(t *testing.T) {
	t.Parallel()
	pool := pgtest.Pool(t, nil)
	table := pgtest.Table(t, pool)
	for _, opts := range [][]pglease.Option{
		{pglease.WithMinHold(9 * time.Second), pglease.WithTable(table), pglease.WithTTL(10 * time.Second)},
		{pglease.WithTable(table), pglease.WithTTL(10 * time.Second), pglease.WithMinHold(10 * time.Second), pglease.WithHolder("h")},
		{pglease.WithTable(table), pglease.WithMinHold(0), pglease.WithLogger(pgtest.Quiet), pglease.WithMinHold(5 * time.Second)},
	} {
		err := panicError(func() { pglease.NewElector(pool, opts...) })
		var oe *pglease.OptionError
		require.ErrorAs(t, err, &oe)
		require.Equal(t, "WithMinHold", oe.Option)
		require.ErrorContains(t, err, "WithMinHold does not apply to NewElector")
	}
	require.Empty(t, fullSnapshot(t, pool, table), "nothing was claimed")
}
