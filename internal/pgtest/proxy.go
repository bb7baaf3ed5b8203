package pgtest

import (
	"fmt"
	"net"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/faultproxy"
)

// Proxy puts a fault proxy in front of the server at dsn (the shared server
// when empty), closed at cleanup.
func Proxy(tb testing.TB, dsn string) *faultproxy.Proxy {
	tb.Helper()
	if dsn == "" {
		dsn = Server.DSN()
	}
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(tb, err)
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(tb, err)
	tb.Cleanup(p.Close)
	return p
}

// AppPool connects to dsn (the shared server when empty), through p when it
// is not nil, with application_name set to app (see AppName) so that the
// test can find the pool's backends in pg_stat_activity. It connects within
// 2 seconds, holds at most 4 connections, and is closed at cleanup.
func AppPool(tb testing.TB, dsn string, p *faultproxy.Proxy, app string) *pgxpool.Pool {
	tb.Helper()
	if dsn == "" {
		dsn = Server.DSN()
	}
	return PoolWith(tb, dsn, func(cfg *pgxpool.Config) {
		if p != nil {
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Host(), p.Port()
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		cfg.MaxConns = 4
	})
}

var appSeq atomic.Int64

// AppName returns prefix made into an application_name unique to this test
// binary, for AppPool.
func AppName(prefix string) string {
	return fmt.Sprintf("%s_%d", prefix, appSeq.Add(1))
}
