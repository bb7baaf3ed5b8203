package pglease_test

import (
	"context"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestOptions: each option is of the option types of exactly the entry
// points it applies to, so that one given elsewhere does not compile; a
// value it refuses is an *OptionError from every constructor.
func TestOptions(t *testing.T) {
	t.Parallel()

	// What the compiler refuses, read from the types: an option given to
	// an entry point whose option type it does not implement does not
	// compile. Each row lists the entry points an option applies to.
	t.Run("ApplyExactlyWhereTheirTypesSay", func(t *testing.T) {
		t.Parallel()
		entry := map[string]reflect.Type{
			"New":        reflect.TypeFor[pglease.LockerOption](),
			"Job":        reflect.TypeFor[pglease.JobOption](),
			"NewElector": reflect.TypeFor[pglease.ElectorOption](),
			"Migrate":    reflect.TypeFor[pglease.MigrateOption](),
			"Schema":     reflect.TypeFor[pglease.SchemaOption](),
			"NewAdmin":   reflect.TypeFor[pglease.AdminOption](),
		}
		for _, c := range []struct {
			option  string
			value   any
			applies []string
		}{
			{"WithHolder", pglease.WithHolder("h"), []string{"New"}},
			{"WithTTL", pglease.WithTTL(time.Minute), []string{"New", "Job", "NewElector"}},
			{"WithTimeout", pglease.WithTimeout(time.Second), []string{"New", "Job", "NewElector"}},
			{"WithMinHold", pglease.WithMinHold(time.Second), []string{"New", "Job"}},
			{"WithHeartbeatInterval", pglease.WithHeartbeatInterval(time.Second), []string{"New"}},
			{"WithTable", pglease.WithTable("t"), []string{"New", "Migrate", "Schema", "NewAdmin"}},
			{"WithRetention", pglease.WithRetention(time.Hour), []string{"Migrate"}},
			{"WithoutFenceColumn", pglease.WithoutFenceColumn(), []string{"New", "NewAdmin"}},
			{"WithKeptConnection", pglease.WithKeptConnection(), []string{"New"}},
			{"WithLogger", pglease.WithLogger(slog.Default()), []string{"New"}},
			{"WithHook", pglease.WithHook(func(pglease.Event) {}), []string{"New"}},
			{"WithLeaderCallbacks", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{}), []string{"NewElector"}},
		} {
			for name, typ := range entry {
				want := false
				for _, a := range c.applies {
					want = want || a == name
				}
				assert.Equal(t, want, reflect.TypeOf(c.value).Implements(typ), "%s given to %s", c.option, name)
			}
		}
	})

	// New returns the error NewLocker panics with: the same *OptionError,
	// naming the option.
	t.Run("NewReturnsTheErrorNewLockerPanicsWith", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		l, err := pglease.New(pool, pglease.WithTTL(time.Second), pglease.WithMinHold(2*time.Second))
		require.Nil(t, l)
		var oe *pglease.OptionError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "WithMinHold", oe.Option)
		require.ErrorIs(t, err, pglease.ErrInvalidOption)
		panicked := panicError(func() { pglease.NewLocker(pool, pglease.WithTTL(time.Second), pglease.WithMinHold(2*time.Second)) })
		assert.Equal(t, err.Error(), panicked.Error())
		require.ErrorAs(t, panicked, &oe)

		l, err = pglease.New(pool, pglease.WithTable(pgtest.TableName()))
		require.NoError(t, err)
		require.NoError(t, l.Close(pgtest.Ctx(t)))
	})

	// Every bad value is reported, not only the first, each naming its
	// option.
	t.Run("ReportsEveryBadValue", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		_, err := pglease.New(pool, pglease.WithTTL(0), pglease.WithHolder(""), pglease.WithTable(""))
		var named []string
		for _, e := range err.(interface{ Unwrap() []error }).Unwrap() {
			var oe *pglease.OptionError
			require.ErrorAs(t, e, &oe)
			named = append(named, oe.Option)
		}
		assert.Equal(t, []string{"WithTTL", "WithHolder", "WithTable"}, named)
	})

	// WithKeptConnection keeps a connection of a *pgxpool.Pool: on any
	// other DB it is refused, not silently ignored.
	t.Run("KeptConnectionNeedsAPool", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		conn, err := pgx.Connect(ctx, pgtest.Server.DSN())
		require.NoError(t, err)
		t.Cleanup(func() { _ = conn.Close(context.Background()) })
		l, err := pglease.New(conn, pglease.WithKeptConnection(), pglease.WithLogger(pgtest.Quiet))
		require.Nil(t, l)
		require.ErrorIs(t, err, pglease.ErrInvalidOption)
		var oe *pglease.OptionError
		require.ErrorAs(t, err, &oe)
		assert.Equal(t, "WithKeptConnection", oe.Option)
		assert.Contains(t, err.Error(), "*pgxpool.Pool of two connections or more")
		require.ErrorIs(t, panicError(func() { pglease.NewLocker(conn, pglease.WithKeptConnection()) }), pglease.ErrInvalidOption)
	})

	// A job's terms are checked against the Locker that extends them, by
	// Locker.Job as by NewElector.
	t.Run("TermsAreCheckedAgainstTheLocker", func(t *testing.T) {
		t.Parallel()
		l := pglease.NewLocker(pgtest.Pool(t, nil), pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(time.Second))
		short := pglease.WithTTL(1500 * time.Millisecond)
		_, jobErr := l.Job(short)
		_, electorErr := pglease.NewElector(l, "leader", short)
		for _, err := range []error{jobErr, electorErr} {
			var oe *pglease.OptionError
			require.ErrorAs(t, err, &oe)
			assert.Equal(t, "WithTTL", oe.Option)
			assert.Contains(t, err.Error(), "heartbeat interval (1s)")
		}
		require.NoError(t, l.Close(context.Background()))
	})
}
