package pglease

import (
	"context"
	"strings"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/listen"
)

// WithListenDSN gives the Locker a connection of its own, dialed with dsn (as
// pgx.ParseConfig reads it), on which it LISTENs for the releases its waiting
// claims (ClaimWait, an Elector's campaign) wait for; statements still run on
// the DB. Use it behind a transaction pooler, which delivers no notifications:
// point dsn at the server itself. The connection is dialed at the first
// waiting claim, checked with a probe notification, dialed again when lost,
// and closed by Close. The default is none: on a *pgxpool.Pool the Locker
// listens on one of the pool's connections. See docs/GUIDE.md,
// "WithListenDSN".
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
			_, err := l.conns.Release().Exec(ctx, sql, args...)
			return err
		}}
	}
	return listen.PoolSource{Pool: l.conns.Pool()}
}
