package pglease_test

import (
	"os"
	"testing"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// coalesceAll is PGLEASE_COALESCE_ALL: every claim of every Locker and
// Elector the tests build goes through the burst's statement, even alone,
// so that the contract tests cover it too (.ci/run runs the suite so).
var coalesceAll = os.Getenv("PGLEASE_COALESCE_ALL") != ""

func TestMain(m *testing.M) {
	if holdTickEnv() != "" {
		holdTick() // this process is a replica a test kills mid-run (ticks_test.go)
		return
	}
	if claimCronEnv() != "" {
		claimCron() // this process is a replica in a time zone of its own (ticks_test.go)
		return
	}
	// Under -short, the tests that need no server: the Locker's logic on
	// the in-memory driver, and the checks of pure functions.
	opts := []pgtest.MainOption{pgtest.ShortRun("^(TestLockerLogic|TestRegistry|TestDrawnFences|TestTableCheck|TestStartOnGrid|ExampleSchema|ExampleStartOnGrid)$")}
	if coalesceAll {
		opts = append(opts,
			pgtest.EveryLocker(func(l *pglease.Locker) { pglease.SetCoalesceAll(l, true) }),
			pgtest.EveryElector(func(e *pglease.Elector) { pglease.SetElectorCoalesceAll(e, true) }))
	}
	pgtest.Main(m, opts...)
}
