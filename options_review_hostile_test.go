package pglease_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// Guarantee: an option a constructor does not apply is refused rather than
// silently ignored, with an error wrapping ErrInvalidOption. Schema prints
// the same DDL whatever the retention, so it refuses WithRetention.
func TestSchemaRefusesOrHonoursWithRetention(t *testing.T) {
	t.Parallel()
	plain, err := pglease.Schema(pglease.WithTable("x"))
	require.NoError(t, err)
	withRetention, err := pglease.Schema(pglease.WithTable("x"), pglease.WithRetention(48*time.Hour))
	if err == nil {
		require.NotEqual(t, plain, withRetention, "Schema accepted WithRetention(48h) and ignored it: same DDL as without it")
		return
	}
	require.ErrorIs(t, err, pglease.ErrInvalidOption)
}

// WithoutFenceColumn given to Migrate (or Schema) is refused as an option
// error like every other: errors.Is(err, ErrInvalidOption), and
// errors.As(*OptionError) names it.
func TestMigrateRefusesWithoutFenceColumnAsAnOptionError(t *testing.T) {
	t.Parallel()
	ctx := pgtest.Ctx(t)
	pool := pgtest.Pool(t, nil)
	err := pglease.Migrate(ctx, pool, pglease.WithTable(pgtest.TableName()), pglease.WithoutFenceColumn())
	require.Error(t, err)
	require.ErrorIs(t, err, pglease.ErrInvalidOption, "Migrate refused WithoutFenceColumn with %q, which is no option error", err)
	var oe *pglease.OptionError
	require.ErrorAs(t, err, &oe)
	require.Equal(t, "WithoutFenceColumn", oe.Option)
}
