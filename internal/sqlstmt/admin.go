package sqlstmt

// The statements of the operator's view of a lease table (List, Revoke,
// ForceExpire, and so `pglease status` and `release`). They work on a table
// created by Migrate and on one of WithoutFenceColumn, whose fence and
// acquired_at may be absent.

// List lists every row with the server's time, read once (the CTE is
// evaluated once) so that every row is judged against the same instant,
// and on the database clock, the only one pglease trusts. Keys are sorted
// byte-wise (COLLATE "C") so that the order does not depend on the
// database's locale. fence and acquired_at are read through to_jsonb of the
// row, so that a table without them (WithoutFenceColumn) lists too, with
// nulls. An existing table may let holder be NULL (a row its owner wrote):
// it is read as it is, and lists as an empty holder rather than failing the
// whole listing.
const List = `WITH server AS (SELECT clock_timestamp() AS now)
SELECT key, holder, (to_jsonb(t) ->> 'fence')::bigint, (to_jsonb(t) ->> 'acquired_at')::timestamptz, expires_at, server.now,
       ` + releasedAndTick + `
  FROM {table} AS t, server
 ORDER BY key COLLATE "C"`

// LockRow reads the key's row and locks it for the rest of the
// transaction, so that what is reported is what was changed: no claim or
// heartbeat can change the row in between. fence and acquired_at go through
// to_jsonb so that a table without them (WithoutFenceColumn) works too. The
// holder is read as it is, NULL included, for Revoke and ForceExpire to
// match it.
const LockRow = `SELECT key, holder, (to_jsonb(t) ->> 'fence')::bigint, (to_jsonb(t) ->> 'acquired_at')::timestamptz, expires_at, clock_timestamp(),
       ` + releasedAndTick + `
  FROM {table} AS t WHERE key = $1 FOR UPDATE`

// releasedAndTick reads released_at and tick of the row t, through
// to_jsonb so that a table without them (made before them, or
// WithoutFenceColumn) lists too, with nulls.
const releasedAndTick = `(to_jsonb(t) ->> 'released_at')::timestamptz, (to_jsonb(t) ->> 'tick')::timestamptz`

// RevokedHolder is the holder Revoke writes in a revoked lease's row (the
// revoke marker). No Locker may have it (WithHolder refuses it, and a
// Locker's holder ends in '#' and a suffix), so nothing of its former
// holder matches the row again. Admin.List reports such a row as Revoked.
const RevokedHolder = "pglease:revoked"

// Revoke takes a live lease's mandate away from its holder without
// letting anyone else in early: it writes the revoke marker ($3,
// RevokedHolder), a holder no Locker can have, and leaves expires_at, fence
// and acquired_at as they were.
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
// The row is locked by LockRow, so holder ($2) still names the mandate
// that was read. IS NOT DISTINCT FROM: a table that lets holder be NULL
// (one an older library or a hand wrote) can hold a live row without
// holder, and = would match it never.
const Revoke = `UPDATE {table}
   SET holder = $3
 WHERE key = $1 AND holder IS NOT DISTINCT FROM $2
RETURNING expires_at, clock_timestamp()`

// ForceExpire expires a live lease in place, as a release does, without
// touching holder or fence: the next claim, by any holder, takes a new
// fence from the sequence, so fences keep growing. Its holder still
// believes in the lease until its next heartbeat, or until its trust
// deadline if that heartbeat fails: hence not what Revoke does.
//
// GREATEST(clock_timestamp(), acquired_at + 1 microsecond): the row must
// keep CHECK (expires_at > acquired_at). clock_timestamp() alone would
// violate it for a lease claimed within the same microsecond, or if the
// server's clock was set back since the claim; one microsecond is
// timestamptz's resolution, the smallest step that satisfies the CHECK. The
// lease is then expired for every claim (expires_at <= clock_timestamp()),
// and its holder's next heartbeat, which requires expires_at >
// clock_timestamp(), finds it lost. Without an acquired_at column the
// second argument is NULL, which GREATEST ignores.
//
// The row is locked by LockRow, so holder ($2) still names the mandate
// that was read; a NULL holder is matched too (IS NOT DISTINCT FROM), as in
// Revoke.
const ForceExpire = `UPDATE {table} AS t
   SET expires_at = GREATEST(clock_timestamp(), (to_jsonb(t) ->> 'acquired_at')::timestamptz + interval '1 microsecond')
 WHERE key = $1 AND holder IS NOT DISTINCT FROM $2
RETURNING expires_at, clock_timestamp()`
