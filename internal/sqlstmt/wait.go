package sqlstmt

// Remaining reads who holds a key and for how long still, both on the
// server: expires_at - clock_timestamp(), never compared with the local
// wall clock. Only a waiting claim sends it, after ErrHeld, so that it wakes
// at the holder's expiry (a lapsed or revoked lease notifies nobody) and
// after a min hold. No row: purged or never claimed, try again at once.
// epoch of each side, not of their difference: an expiry pinned at
// 'infinity' reads as an infinite wait rather than failing the statement.
const Remaining = `SELECT holder, extract(epoch FROM expires_at)::float8 - extract(epoch FROM clock_timestamp())::float8
  FROM {table} WHERE key = $1`

// Listen subscribes the Locker's listening connection to its table's
// release channel ({chan}, a quoted identifier: LISTEN takes no parameter).
const Listen = `LISTEN {chan}`

// Probe sends a notification on a channel ($1) with a payload ($2), to
// check that the listening connection receives what the release statement
// sends: PgBouncer in transaction pooling mode accepts LISTEN and delivers
// nothing.
const Probe = `SELECT pg_notify($1, $2)`
