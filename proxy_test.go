package pglease_test

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease/internal/faultproxy"
	"github.com/pglease/pglease/internal/pgtest"
)

// newProxy puts a fault proxy in front of the server at dsn (the shared
// server when empty), closed at cleanup.
func newProxy(t *testing.T, dsn string) *faultproxy.Proxy {
	t.Helper()
	if dsn == "" {
		dsn = pgtest.Server.DSN()
	}
	cfg, err := pgx.ParseConfig(dsn)
	require.NoError(t, err)
	p, err := faultproxy.New(net.JoinHostPort(cfg.Host, strconv.Itoa(int(cfg.Port))))
	require.NoError(t, err)
	t.Cleanup(p.Close)
	return p
}

// appPool connects to dsn (the shared server when empty), through p when it
// is not nil, with application_name set to app so that the test can find
// the pool's backends in pg_stat_activity. Closed at cleanup.
func appPool(t *testing.T, dsn string, p *faultproxy.Proxy, app string) *pgxpool.Pool {
	t.Helper()
	if dsn == "" {
		dsn = pgtest.Server.DSN()
	}
	return pgtest.PoolWith(t, dsn, func(cfg *pgxpool.Config) {
		if p != nil {
			cfg.ConnConfig.Host, cfg.ConnConfig.Port = p.Host(), p.Port()
		}
		cfg.ConnConfig.RuntimeParams["application_name"] = app
		cfg.ConnConfig.ConnectTimeout = 2 * time.Second
		cfg.MaxConns = 4
	})
}

var appSeq = 0

var appMu sync.Mutex

// appName returns an application_name unique to this test binary.
func appName(prefix string) string {
	appMu.Lock()
	defer appMu.Unlock()
	appSeq++
	return fmt.Sprintf("%s_%d", prefix, appSeq)
}
