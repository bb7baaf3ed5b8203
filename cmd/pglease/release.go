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
	"github.com/pglease/pglease/internal/driver"
	"github.com/pglease/pglease/internal/sqlstmt"
)

var releaseCommand = command{
	name:  "release",
	args:  "KEY",
	nargs: 1,
	summary: "Revokes the live lease on KEY, whoever holds it: its holder loses it at its next\n" +
		"heartbeat (its job's lease context is cancelled), and no holder can claim the key\n" +
		"before the lease would have expired, by which time the holder has stopped trusting\n" +
		"it whatever happened to its heartbeat. The row's holder becomes " + fmt.Sprintf("%q", sqlstmt.RevokedHolder) + ";\n" +
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
		return c.withConn(ctx, func(conn *pgx.Conn) error {
			return release(ctx, c, conn, c.args[0])
		})
	},
}

// release runs Admin.Revoke, or Admin.ForceExpire with -now, and says
// what it found and did.
func release(ctx context.Context, c *cli, conn *pgx.Conn, key string) error {
	admin, err := c.admin(conn)
	if err != nil {
		return err
	}
	change := admin.Revoke
	if c.now {
		change = admin.ForceExpire
	}
	rev, err := change(ctx, key)
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pglease.ErrNotFound):
		return fmt.Errorf("key %q not found in table %s", key, c.table)
	case errors.As(err, &pgErr) && pgErr.Code == driver.StringTooLong:
		return fmt.Errorf("cannot revoke key %q: the holder column of %s is too short for the revoke marker %q (%d characters); "+
			"nothing changed. release -now expires the lease at once instead, with the risk it prints: %w",
			key, c.table, sqlstmt.RevokedHolder, len(sqlstmt.RevokedHolder), pgErr)
	case err != nil:
		return err
	}
	h := rev.Row
	switch {
	case !h.Live:
		fmt.Fprintf(c.stdout, "key %q was not live: holder %q, fence %s, expired at %s; nothing changed\n",
			key, h.Holder, fenceText(h.Fence), h.ExpiresAt.UTC().Format(timeFormat))
	case c.now:
		printForceExpired(c, rev)
	case !rev.Changed && h.NeverExpires: // revoked already
		fmt.Fprintf(c.stdout, "key %q is already revoked: fence %s; its row never expires (expires_at is infinity), so no holder "+
			"can claim it until release -now expires it; nothing changed\n", key, fenceText(h.Fence))
	case !rev.Changed:
		fmt.Fprintf(c.stdout, "key %q is already revoked: fence %s; any holder may claim it from %s; nothing changed\n",
			key, fenceText(h.Fence), h.ExpiresAt.UTC().Format(timeFormat))
	case h.NeverExpires:
		fmt.Fprintf(c.stdout, "revoked key %q: holder %q, fence %s; the holder loses it at its next heartbeat; "+
			"its row never expires (expires_at is infinity), so no holder can claim it until release -now expires it\n",
			key, h.Holder, fenceText(h.Fence))
	default:
		in := rev.ExpiresAt.Sub(rev.ServerNow).Round(time.Millisecond)
		fmt.Fprintf(c.stdout, "revoked key %q: holder %q, fence %s; the holder loses it at its next heartbeat; "+
			"any holder may claim it from %s (in %v), when the lease would have expired\n",
			key, h.Holder, fenceText(h.Fence), rev.ExpiresAt.UTC().Format(timeFormat), in)
	}
	return nil
}

func printForceExpired(c *cli, rev pglease.Revocation) {
	h := rev.Row
	fmt.Fprintf(c.stdout, "released key %q: holder %q, fence %s, was live until %s; now expires at %s\n",
		h.Key, h.Holder, fenceText(h.Fence), expiryText(h), rev.ExpiresAt.UTC().Format(timeFormat))
	fmt.Fprintf(c.stderr, "pglease release -now: WARNING: key %q can be claimed at once, but its holder %q may go on "+
		"believing it holds the lease until its next heartbeat, or until %s if that heartbeat fails: until then two "+
		"replicas may run the job at once. Without -now, release revokes the lease instead and keeps the key until then.\n",
		h.Key, h.Holder, expiryText(h))
	if rev.ExpiresAt.After(rev.ServerNow) && !h.AcquiredAt.IsZero() {
		// Only when acquired_at is ahead of the server's clock (the clock
		// was set back since the claim): the CHECK keeps the expiry after it.
		fmt.Fprintf(c.stderr, "pglease release: the server clock is behind the claim's acquired_at (%s): the key stays held until then\n",
			h.AcquiredAt.UTC().Format(timeFormat))
	}
}

// expiryText prints a row's expiry, or "infinity" for a row that never
// expires.
func expiryText(r pglease.LeaseInfo) string {
	if r.NeverExpires {
		return "infinity"
	}
	return r.ExpiresAt.UTC().Format(timeFormat)
}

// fenceText prints a fence, or "none" for a table without fence column.
func fenceText(fence int64) string {
	if fence == 0 { // fences start at 1
		return "none"
	}
	return fmt.Sprint(fence)
}
