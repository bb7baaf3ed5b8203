package pglease_test

import (
	"context"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestOptions: one Option type serves every entry point; each entry point
// takes the options the Option doc lists for it and refuses every other one
// with an error (ErrInvalidOption) that names the option, the entry point
// and where the option goes instead, before it sends anything; a value an
// option refuses is such an error from every constructor.
func TestOptions(t *testing.T) {
	t.Parallel()

	t.Run("EachEntryPointRefusesWhatItDoesNotTakeNamingTheFix", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		l := pgtest.Locker(t, pool, table, "options", pglease.WithTTL(time.Minute))
		fresh := pgtest.TableName() // Migrate must not create it when it refuses an option
		entries := []struct {
			name string
			call func(o pglease.Option) error
		}{
			{"NewLocker", func(o pglease.Option) error { // New: NewLocker's error, not its panic
				nl, err := pglease.New(pool, pglease.WithTable(table), pglease.WithLogger(pgtest.Quiet), o)
				if err == nil {
					require.NoError(t, nl.Close(ctx))
				}
				return err
			}},
			{"Locker.Job", func(o pglease.Option) error { _, err := l.Job(o); return err }},
			{"NewElector", func(o pglease.Option) error {
				e, err := pglease.NewElector(l, "leader-"+pgtest.TableName(), o)
				if err == nil {
					require.NoError(t, e.Close(ctx))
				}
				return err
			}},
			{"Migrate", func(o pglease.Option) error {
				err := pglease.Migrate(ctx, pool, pglease.WithTable(fresh), o)
				if err == nil { // it took o: leave fresh to the options it refuses
					_, err = pool.Exec(ctx, "DROP TABLE IF EXISTS "+fresh+"; DROP SEQUENCE IF EXISTS "+fresh+"_fence_seq")
				}
				return err
			}},
			{"Schema", func(o pglease.Option) error { _, err := pglease.Schema(o); return err }},
			{"NewAdmin", func(o pglease.Option) error { _, err := pglease.NewAdmin(pool, o); return err }},
		}
		// Each row lists the entry points an option applies to, as the
		// Option doc's table does.
		for _, c := range []struct {
			option  string
			value   pglease.Option
			applies []string
		}{
			{"WithHolder", pglease.WithHolder("h"), []string{"NewLocker"}},
			{"WithTTL", pglease.WithTTL(time.Minute), []string{"NewLocker", "Locker.Job", "NewElector"}},
			{"WithTimeout", pglease.WithTimeout(time.Second), []string{"NewLocker", "Locker.Job", "NewElector"}},
			{"WithMinHold", pglease.WithMinHold(time.Second), []string{"NewLocker", "Locker.Job"}},
			{"WithHeartbeatInterval", pglease.WithHeartbeatInterval(time.Second), []string{"NewLocker"}},
			{"WithTable", pglease.WithTable(table), []string{"NewLocker", "Migrate", "Schema", "NewAdmin"}},
			{"WithRetention", pglease.WithRetention(time.Hour), []string{"Migrate"}},
			{"WithoutFenceColumn", pglease.WithoutFenceColumn(), []string{"NewLocker", "NewAdmin"}},
			{"WithKeptConnection", pglease.WithKeptConnection(), []string{"NewLocker"}},
			{"WithListenDSN", pglease.WithListenDSN(pgtest.Server.DSN()), []string{"NewLocker"}},
			{"WithLogger", pglease.WithLogger(slog.Default()), []string{"NewLocker"}},
			{"WithHook", pglease.WithHook(func(pglease.Event) {}), []string{"NewLocker"}},
			{"WithLeaderCallbacks", pglease.WithLeaderCallbacks(pglease.LeaderCallbacks{}), []string{"NewElector"}},
		} {
			for _, e := range entries {
				err := e.call(c.value)
				if slices.Contains(c.applies, e.name) {
					assert.NoError(t, err, "%s takes %s", e.name, c.option)
					continue
				}
				require.ErrorIs(t, err, pglease.ErrInvalidOption, "%s refuses %s", e.name, c.option)
				assert.Equal(t, c.option, pglease.OptionNamed(err), "the error names the option: %v", err)
				// "pglease: WithMinHold does not apply to NewElector: <why, and
				// what to use instead> (it applies to NewLocker and Locker.Job)"
				assert.Regexp(t, `^pglease: `+c.option+` does not apply to `+regexp.QuoteMeta(e.name)+`: .{20,} \(it applies to [^)]+\)$`, err.Error())
				_, where, _ := strings.Cut(err.Error(), "(it applies to ")
				for _, other := range entries {
					if slices.Contains(c.applies, other.name) {
						assert.Contains(t, where, other.name, "%v names where %s goes", err, c.option)
					} else {
						assert.NotContains(t, where, other.name, "%v", err)
					}
				}
			}
		}
		var created *string
		require.NoError(t, pool.QueryRow(ctx, "SELECT to_regclass($1)::text", fresh).Scan(&created))
		assert.Nil(t, created, "Migrate created nothing while it refused an option")
	})

	// New returns the error NewLocker panics with: the same error,
	// naming the option.
	t.Run("NewReturnsTheErrorNewLockerPanicsWith", func(t *testing.T) {
		t.Parallel()
		pool := pgtest.Pool(t, nil)
		l, err := pglease.New(pool, pglease.WithTTL(time.Second), pglease.WithMinHold(2*time.Second))
		require.Nil(t, l)
		assert.Equal(t, "WithMinHold", pglease.OptionNamed(err))
		require.ErrorIs(t, err, pglease.ErrInvalidOption)
		panicked := panicError(func() { pglease.NewLocker(pool, pglease.WithTTL(time.Second), pglease.WithMinHold(2*time.Second)) })
		assert.Equal(t, err.Error(), panicked.Error())
		assert.Equal(t, "WithMinHold", pglease.OptionNamed(panicked))

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
			require.ErrorIs(t, e, pglease.ErrInvalidOption)
			named = append(named, pglease.OptionNamed(e))
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
		assert.Equal(t, "WithKeptConnection", pglease.OptionNamed(err))
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
			assert.Equal(t, "WithTTL", pglease.OptionNamed(err))
			assert.Contains(t, err.Error(), "heartbeat interval (1s)")
		}
		require.NoError(t, l.Close(context.Background()))
	})
}
