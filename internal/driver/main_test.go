package driver_test

import (
	"testing"

	"github.com/pglease/pglease/internal/pgtest"
)

// TestMain gives the contract test a server; under -short, only the tests
// that need none run.
func TestMain(m *testing.M) {
	pgtest.Main(m, pgtest.ShortRun("^(TestClosings|TestClaimBound|TestOutcome|TestRetrySerialization|TestInlineArgs|TestSQLState|TestServerError|TestSQLStateOfAnErrorWithoutOneAllocatesNothing|TestSQLStateOfSuccessAllocatesNothing|TestNoDeadline|TestUncancelled|TestClaimRow|TestPgxDefaults)$"))
}
