package drivertest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/driver"
)

// testCase is one case of the contract: its name and its body.
type testCase struct {
	name string
	run  func(c *tc)
}

// cases is the contract, in the order of the protocol: claims, heartbeats,
// releases, reads, ticks, and rows locked by another transaction.
var cases = concat(claimCases, extendCases, releaseCases, readCases, tickCases, lockCases)

func concat(lists ...[]testCase) []testCase {
	var out []testCase
	for _, l := range lists {
		out = append(out, l...)
	}
	return out
}

// tc is what a case works with: a fresh table, the two holders' protocols
// on it, and the harness's Short.
type tc struct {
	*testing.T
	ctx   context.Context
	table Table
	db    driver.DB
	a, b  driver.Protocol
	short time.Duration
}

func newCase(t *testing.T, h Harness) *tc {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	table := h.New(t)
	return &tc{T: t, ctx: ctx, table: table, db: table.DB(), a: table.Protocol("a"), b: table.Protocol("b"), short: h.Short}
}

// claim claims key with p for ttl; the case fails unless it took it.
func (c *tc) claim(p driver.Protocol, key string, ttl time.Duration) driver.Claimed {
	c.Helper()
	got, ok, err := p.Claim(c.ctx, c.db, key, ttl, 0)
	require.NoError(c, err)
	require.True(c, ok, "the claim of %q was refused", key)
	require.True(c, got.Live, "the claim of %q returned a row not live", key)
	return got
}

// refused claims key with p; the case fails unless the claim was refused.
func (c *tc) refused(p driver.Protocol, key string) {
	c.Helper()
	_, ok, err := p.Claim(c.ctx, c.db, key, long, 0)
	require.NoError(c, err)
	require.False(c, ok, "the claim of %q was not refused", key)
}

// row reads the row of key; the case fails if there is none.
func (c *tc) row(key string) Row {
	c.Helper()
	r, ok := c.table.Row(key)
	require.True(c, ok, "no row for %q", key)
	return r
}

// requireRow checks the row of key: its holder and fence, live or not.
func (c *tc) requireRow(key, holder string, fence int64, live bool) {
	c.Helper()
	require.Equal(c, Row{Holder: holder, Fence: fence, Live: live}, c.row(key), "the row of %q", key)
}

// lease is the lease a claim returned, as a heartbeat or release sends it.
func lease(key string, got driver.Claimed, ttl time.Duration) driver.Lease {
	return driver.Lease{Key: key, Fence: got.Fence, Holder: got.Holder, AcquiredAt: got.AcquiredAt, TTL: ttl}
}
