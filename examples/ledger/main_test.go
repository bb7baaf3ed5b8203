package main

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The demo's summary proves its claims from the ledger; a run long enough
// to pause every replica a few times refuses some late commit.
func TestLedgerDemoHoldsNoLateWriteAndRefusesPausedCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	code, err := run(ctx, []string{"-dsn", pgtest.Server.DSN(), "-for", "12s", "-seed", "7"}, &out)
	t.Log(out.String())
	require.NoError(t, err)
	assert.NotContains(t, out.String(), "VIOLATIONS")
	assert.Contains(t, out.String(), "ok: per key, in commit order")
	assert.Equal(t, 0, code)
}
