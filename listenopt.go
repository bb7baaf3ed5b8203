package pglease

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/listen"
)

// WithListenDSN gives the Locker a connection of its own, dialed with dsn
// (a URL or keyword/value string, as pgx.ParseConfig reads it), on which
// it LISTENs for the releases its waiting claims (ClaimWait, an Elector's
// campaign) wait for. Every statement still runs on the DB given to New.
//
// It is for a DB that cannot LISTEN: a pooler in transaction pooling mode
// (PgBouncer) accepts LISTEN and delivers nothing, and a *pgx.Conn or a
// wrapper has no connection to spare, so waiters poll (WaitByPolling,
// about one claim and one read per second and waiting key). Point dsn at
// the server itself, past the pooler: releases, sent through the pooler,
// notify it, and waiters wake within a round trip of a release. With it,
// the kind of the DB does not matter.
//
// The connection is dialed at the first waiting claim and closed by Close.
// It counts against the server's max_connections, one per Locker that
// waits; its statements are LISTEN and, after each 500ms without a
// notification, an empty query that proves it alive: a ping that fails or
// takes over a second counts as a lost connection (a half-open one
// delivers nothing and says nothing). When it is lost, waiters poll at
// once, and it is dialed again after a pause that doubles from 100ms up to
// 30s, which starts over only after a connection that listened for 10s; a
// dial (with LISTEN and the probe's sending) that takes over 10s is given
// up and tried again.
// Before the Locker relies on a connection, a probe notification sent
// through the DB must come back on it within 2s: if dsn points at the
// pooler too, or at another server or database, or the link is slow, the
// Locker polls, WaitMode says why, and the probe is tried again after a
// pause that doubles from 5s up to 5 minutes. The default is no connection
// of its own: on a *pgxpool.Pool the Locker LISTENs on one of the pool's
// connections, taken from it until Close, in the same way.
//
// A dsn that does not parse, or an empty one, is an error at New.
func WithListenDSN(dsn string) Option {
	return Option{"WithListenDSN", atLocker, lockerWide, func(c *config) {
		if strings.TrimSpace(dsn) == "" {
			c.invalid("WithListenDSN", "WithListenDSN: dsn is empty: give the server's address, past the pooler")
			return
		}
		cfg, err := pgx.ParseConfig(dsn)
		if err != nil {
			// pgx's error redacts the password.
			c.invalid("WithListenDSN", "WithListenDSN: dsn does not parse: %v", err)
			return
		}
		c.listen = cfg
	}}
}

// listenSource is where the listener takes its connection: the one of
// WithListenDSN, probed through the DB the statements run on, or else one
// of the pool's (startListener has checked that there is a pool).
func (l *Locker) listenSource() listen.Source {
	if cfg := l.cfg.listen; cfg != nil {
		return listen.DialSource{Config: cfg, Send: func(ctx context.Context, sql string, args ...any) error {
			_, err := l.conns.release.Exec(ctx, sql, args...)
			return err
		}}
	}
	return listen.PoolSource{Pool: l.conns.pool}
}
