package orm_test

import (
	"database/sql"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"gorm.io/driver/postgres"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// TestGORM: GuardSQL fences a GORM transaction in either mode of GORM,
// through sqlTxOf, and refuses the commit of a lease that is no longer
// current.
func TestGORM(t *testing.T) {
	t.Parallel()
	for _, prepare := range []bool{false, true} {
		name := map[bool]string{false: "Plain", true: "PrepareStmt"}[prepare]
		t.Run(name+"/LostLeaseWritesNothing", func(t *testing.T) {
			t.Parallel()
			ctx, pool, table := pgtest.Setup(t)
			db, err := gorm.Open(postgres.Open(pool.Config().ConnString()), &gorm.Config{PrepareStmt: prepare, Logger: logger.Discard})
			require.NoError(t, err)
			sqlDB, err := db.DB()
			require.NoError(t, err)
			t.Cleanup(func() { _ = sqlDB.Close() })
			report := table + "_report"
			require.NoError(t, db.Table(report).AutoMigrate(&Report{}))
			locker := pgtest.Locker(t, pglease.SQL(sqlDB), table, "a")
			lease, err := locker.Claim(ctx, "daily-report")
			require.NoError(t, err)
			_, err = pgtest.Locker(t, pool, table, "b").Claim(ctx, "daily-report")
			require.ErrorIs(t, err, pglease.ErrHeld)
			_, err = adminOf(t, pool, table).ForceExpire(ctx, "daily-report")
			require.NoError(t, err)
			_, err = pgtest.Locker(t, pool, table, "b").Claim(ctx, "daily-report")
			require.NoError(t, err, "another replica takes the key")

			err = db.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
				require.NoError(t, tx.Table(report).Save(&Report{Day: "2024-01-31", Total: 42}).Error)
				_, bare := tx.Statement.ConnPool.(*sql.Tx)
				assert.Equal(t, !prepare, bare, "with PrepareStmt, ConnPool wraps the *sql.Tx")
				sqlTx, err := sqlTxOf(tx)
				require.NoError(t, err)
				return lease.GuardSQL(ctx, sqlTx)
			})
			require.ErrorIs(t, err, pglease.ErrLost)
			var n int64
			require.NoError(t, db.Table(report).Count(&n).Error)
			assert.Zero(t, n, "the refused transaction wrote nothing")
		})
	}
}

func adminOf(t *testing.T, db pglease.DB, table string) *pglease.Admin {
	t.Helper()
	a, err := pglease.NewAdmin(db, pglease.WithTable(table))
	require.NoError(t, err)
	return a
}
