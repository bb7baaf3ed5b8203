package orm_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/pglease/pglease/internal/pgtest"
)

// GORM's prepared statement cache (PrepareStmt) starts a goroutine that
// never ends (gorm.io/gorm/internal/lru: "done channel is never closed").
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.IgnoreGoroutines(goleak.IgnoreTopFunction("gorm.io/gorm/internal/lru.NewLRU[...].func1")))
}

// databaseURL stands for your service's connection string.
func databaseURL() string { return pgtest.Server.DSN() }
