package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"github.com/pglease/pglease"
)

// releaseLockSQL reads the key's row and locks it for the rest of the
// transaction, so that what is printed is what was released: no claim or
// heartbeat can change the row in between. fence and acquired_at go through
// to_jsonb so that a table without them (WithoutFenceColumn) works too.
const releaseLockSQL = `SELECT holder, (to_jsonb(t) ->> 'fence')::bigint, expires_at, expires_at > clock_timestamp() AS live
  FROM {table} AS t WHERE key = $1 FOR UPDATE`

// revokeSQL takes a live lease's mandate away from its holder without
// letting anyone else in early: it writes pglease.RevokedHolder ($3), a
// holder no Locker can have, and leaves expires_at, fence and acquired_at
// as they were.
//
//   - The holder's next heartbeat matches no row (its holder, or its forged
//     holder with WithoutFenceColumn, is gone): the lease is lost there, and
//     its Unlock touches nothing.
//   - Its own re-entrant claim cannot take it back: that needs the row's
//     holder to be its own (or, without fence column, one it forged:
//     '#' and 16 hex digits, which the marker has not).
//   - Every other claim needs expires_at to have passed. The holder stops
//     trusting its lease at sent_at + TTL - margin of its last successful
//     claim or heartbeat, which is before the expiry that statement set on
//     the server: so nobody can claim the key before the holder's trust
//     deadline has passed, and two replicas never believe at once.
//   - The next claim, once expired, draws a new fence from the sequence.
//
// The row is locked by releaseLockSQL, so holder ($2) still names the
// mandate that was read. expires_in is on the server's clock.
const revokeSQL = `UPDATE {table}
   SET holder = $3
 WHERE key = $1 AND holder = $2
RETURNING expires_at, extract(epoch FROM expires_at - clock_timestamp())`

// forceExpireSQL (release -now) expires a live lease in place, as a release
// does, without touching holder or fence: the next claim, by any holder,
// takes a new fence from the sequence, so fences keep growing. Its holder
// still believes in the lease until its next heartbeat, or until its trust
// deadline if that heartbeat fails: hence not the default.
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
	summary: "Revokes the live lease on KEY, whoever holds it: its holder loses it at its next\n" +
		"heartbeat (its job's lease context is cancelled), and no holder can claim the key\n" +
		"before the lease would have expired, by which time the holder has stopped trusting\n" +
		"it whatever happened to its heartbeat. The row's holder becomes " + fmt.Sprintf("%q", pglease.RevokedHolder) + ";\n" +
		"expiry and fence stay as they were, and the next claim takes a greater fence.\n" +
		"\n" +
		"-now expires the lease at once instead, so that any holder can claim the key\n" +
		"right away. UNSAFE: its holder goes on believing it holds the lease until its next\n" +
		"heartbeat, or up to the old expiry if that heartbeat fails, so two replicas may run\n" +
		"the job at once. It prints that warning on stderr.\n" +
		"\n" +
		"A key that is already expired is left untouched. Exits 1 if the key does not\n" +
		"exist. Needs SELECT and UPDATE on the table.",
	flags: func(fs *flag.FlagSet, c *cli) {
		fs.BoolVar(&c.now, "now", false, "expire the lease at once instead of revoking it (UNSAFE: two replicas may believe they hold it)")
	},
	do: func(ctx context.Context, c *cli) error {
		key := c.args[0]
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			return pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
				return release(ctx, c, tx, key)
			})
		})
	},
}

// held is a key's row as releaseLockSQL read and locked it.
type held struct {
	key, holder string
	fence       *int64
	expiresAt   time.Time
	live        bool
}

func release(ctx context.Context, c *cli, tx pgx.Tx, key string) error {
	h := held{key: key}
	err := tx.QueryRow(ctx, c.render(releaseLockSQL), key).Scan(&h.holder, &h.fence, &h.expiresAt, &h.live)
	if errors.Is(err, pgx.ErrNoRows) {
		return fmt.Errorf("key %q not found in table %s", key, c.table)
	}
	if err != nil {
		return err
	}
	if !h.live {
		fmt.Fprintf(c.stdout, "key %q was not live: holder %q, fence %s, expired at %s; nothing changed\n",
			key, h.holder, fenceText(h.fence), h.expiresAt.UTC().Format(timeFormat))
		return nil
	}
	if c.now {
		return forceExpire(ctx, c, tx, h)
	}
	return revoke(ctx, c, tx, h)
}

func revoke(ctx context.Context, c *cli, tx pgx.Tx, h held) error {
	if h.holder == pglease.RevokedHolder {
		fmt.Fprintf(c.stdout, "key %q is already revoked: fence %s; any holder may claim it from %s; nothing changed\n",
			h.key, fenceText(h.fence), h.expiresAt.UTC().Format(timeFormat))
		return nil
	}
	var (
		expiresAt time.Time
		inSeconds float64
	)
	err := tx.QueryRow(ctx, c.render(revokeSQL), h.key, h.holder, pglease.RevokedHolder).Scan(&expiresAt, &inSeconds)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "22001" { // string_data_right_truncation
		return fmt.Errorf("cannot revoke key %q: the holder column of %s is too short for the revoke marker %q (%d characters); "+
			"nothing changed. release -now expires the lease at once instead, with the risk it prints: %w",
			h.key, c.table, pglease.RevokedHolder, len(pglease.RevokedHolder), err)
	}
	if err != nil {
		return err
	}
	in := time.Duration(inSeconds * float64(time.Second)).Round(time.Millisecond)
	fmt.Fprintf(c.stdout, "revoked key %q: holder %q, fence %s; the holder loses it at its next heartbeat; "+
		"any holder may claim it from %s (in %v), when the lease would have expired\n",
		h.key, h.holder, fenceText(h.fence), expiresAt.UTC().Format(timeFormat), in)
	return nil
}

func forceExpire(ctx context.Context, c *cli, tx pgx.Tx, h held) error {
	var (
		newExpiry  time.Time
		acquiredAt *time.Time
		expired    bool
	)
	if err := tx.QueryRow(ctx, c.render(forceExpireSQL), h.key, h.holder).Scan(&newExpiry, &acquiredAt, &expired); err != nil {
		return err
	}
	fmt.Fprintf(c.stdout, "released key %q: holder %q, fence %s, was live until %s; now expires at %s\n",
		h.key, h.holder, fenceText(h.fence), h.expiresAt.UTC().Format(timeFormat), newExpiry.UTC().Format(timeFormat))
	fmt.Fprintf(c.stderr, "pglease release -now: WARNING: key %q can be claimed at once, but its holder %q may go on "+
		"believing it holds the lease until its next heartbeat, or until %s if that heartbeat fails: until then two "+
		"replicas may run the job at once. Without -now, release revokes the lease instead and keeps the key until then.\n",
		h.key, h.holder, h.expiresAt.UTC().Format(timeFormat))
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
