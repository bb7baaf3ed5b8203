package main

import (
	"bytes"
	"context"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgserver"
)

var server *pgserver.Server

func TestMain(m *testing.M) {
	server = pgserver.ForTestMain(pgserver.Options{})
	os.Exit(server.AfterTests(m.Run()))
}

// The demo's summary proves its claims from the ledger; a run long enough
// to pause every replica a few times refuses some late commit.
func TestLedgerDemoHoldsNoLateWriteAndRefusesPausedCommits(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var out bytes.Buffer
	code, err := run(ctx, []string{"-dsn", server.DSN(), "-for", "12s", "-seed", "7"}, &out)
	t.Log(out.String())
	require.NoError(t, err)
	assert.NotContains(t, out.String(), "VIOLATIONS")
	assert.Contains(t, out.String(), "ok: per key, in commit order")
	assert.Equal(t, 0, code)
}
