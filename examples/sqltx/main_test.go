package main

import (
	"bytes"
	"context"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/pgtest"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// Guarantee: on both drivers the demo's stale write is refused and only the
// current leases' writes land.
func TestDemo(t *testing.T) {
	for _, driver := range []string{"postgres", "pgx"} {
		t.Run(driver, func(t *testing.T) {
			var stdout, stderr bytes.Buffer
			code := run(context.Background(), []string{"-driver", driver, "-dsn", pgtest.Server.DSN()}, &stdout, &stderr)
			t.Logf("%s\n%s", stdout.String(), stderr.String())
			require.Equal(t, 0, code)
			assert.Contains(t, stdout.String(), "a wakes up and writes again: lost=true")
			assert.Contains(t, stdout.String(), "ledger: a fence")
			assert.Contains(t, stdout.String(), "ledger: b fence")
		})
	}
}
