package main

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
)

// releaseLockSQL reads the key's row and locks it for the rest of the
// transaction, so that what is printed is what was released: no claim or
// heartbeat can change the row in between. fence and acquired_at go through
// to_jsonb so that a table without them (WithoutFenceColumn) works too.
const releaseLockSQL = `SELECT holder, (to_jsonb(t) ->> 'fence')::bigint, expires_at, expires_at > clock_timestamp() AS live
  FROM {table} AS t WHERE key = $1 FOR UPDATE`

// forceExpireSQL expires a live lease in place, as a release does, without
// touching holder or fence: the next claim, by any holder, takes a new
// fence from the sequence, so fences keep growing.
//
// GREATEST(clock_timestamp(), acquired_at + 1 microsecond): the row must
// keep CHECK (expires_at > acquired_at). clock_timestamp() alone would
// violate it for a lease claimed within the same microsecond, or if the
// server's clock was set back since the claim; one microsecond is
// timestamptz's resolution, the smallest step that satisfies the CHECK. The
// lease is then expired for every claim (expires_at <= clock_timestamp()),
// and its holder's next heartbeat, which requires expires_at >
// clock_timestamp(), finds it lost.
//
// The row is locked by releaseLockSQL, so holder still names the mandate
// that was read; acquired_at is read through to_jsonb for tables without it.
const forceExpireSQL = `UPDATE {table} AS t
   SET expires_at = GREATEST(clock_timestamp(), (to_jsonb(t) ->> 'acquired_at')::timestamptz + interval '1 microsecond')
 WHERE key = $1 AND holder = $2
RETURNING expires_at, (to_jsonb(t) ->> 'acquired_at')::timestamptz, expires_at <= clock_timestamp() AS expired`

var releaseCommand = command{
	name:  "release",
	args:  "KEY",
	nargs: 1,
	summary: "Expires the lease on KEY now, whoever holds it, so that any holder can claim it\n" +
		"at once (with a greater fence). Its holder finds it lost at its next heartbeat and\n" +
		"cancels the job's lease context. Holder and fence are left as they were. A key\n" +
		"that is already expired is left untouched. Exits 1 if the key does not exist.\n" +
		"Needs SELECT and UPDATE on the table.",
	do: func(ctx context.Context, c *cli) error {
		key := c.args[0]
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return forceExpire(ctx, c, tx, key)
			})
		})
	},
}

func forceExpire(ctx context.Context, c *cli, tx pgx.Tx, key string) error {
	var (
		holder    string
		fence     *int64
		expiresAt time.Time
		live      bool
	)
	err := tx.QueryRow(ctx, c.render(releaseLockSQL), key).Scan(&holder, &fence, &expiresAt, &live)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("key %q not found in table %s", key, c.table)
	}
	if err != nil {
		return err
	}
	if !live {
		fmt.Fprintf(c.stdout, "key %q was not live: holder %q, fence %s, expired at %s; nothing changed\n",
			key, holder, fenceText(fence), expiresAt.UTC().Format(timeFormat))
		return nil
	}
	var (
		newExpiry  time.Time
		acquiredAt *time.Time
		expired    bool
	)
	if err := tx.QueryRow(ctx, c.render(forceExpireSQL), key, holder).Scan(&newExpiry, &acquiredAt, &expired); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "released key %q: holder %q, fence %s, was live until %s; now expires at %s\n",
		key, holder, fenceText(fence), expiresAt.UTC().Format(timeFormat), newExpiry.UTC().Format(timeFormat))
	if !expired && acquiredAt != nil {
		// Only when acquired_at is ahead of the server's clock (the clock
		// was set back since the claim): the CHECK keeps the expiry after it.
		fmt.Fprintf(c.stderr, "pglease release: the server clock is behind the claim's acquired_at (%s): the key stays held until then\n",
			acquiredAt.UTC().Format(timeFormat))
	}
	return nil
}

// fenceText prints a fence, or "none" for a table without fence column.
func fenceText(fence *int64) string {
	if fence == nil {
		return "none"
	}
	return fmt.Sprint(*fence)
}
