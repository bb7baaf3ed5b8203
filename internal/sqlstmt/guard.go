package sqlstmt

// Guard checks, inside the caller's transaction, that the lease row is
// still this lease's, and locks it until that transaction ends.
//
//   - FOR SHARE, not FOR UPDATE: it conflicts with every statement that could
//     hand the key to a later lease (the claim's ON CONFLICT DO UPDATE,
//     the heartbeat, the release and the purge take the row FOR NO KEY
//     UPDATE or stronger), so they wait for the transaction to end. Two
//     guarded transactions of the same lease do not wait for each other.
//   - The match is the lease's own: key, holder and fence. A row re-claimed
//     by anyone, this holder included, carries another fence; a lapsed row
//     fails expires_at > clock_timestamp(), the server's clock, evaluated
//     after any wait on the row lock (READ COMMITTED rechecks the WHERE on
//     the newest version of the row). tableoid is the table the claim
//     wrote to: a transaction whose search_path resolves the name to
//     another table (a tenant's schema, another database) matches nothing.
//   - 1 / count(*) divides by zero when no row matched: the statement fails
//     (SQLSTATE 22012), which aborts the transaction, so that its COMMIT can
//     only roll back even if the caller ignores Guard's error. count(*) is
//     not a constant, so the division cannot be folded at plan time.
const Guard = `SELECT 1 / count(*) FROM (
  SELECT 1 FROM {table}
   WHERE key = $1 AND holder = $2 COLLATE "C" AND fence = $3 AND tableoid = $4 AND expires_at > clock_timestamp()
     FOR SHARE
) AS this_lease`

// UnfencedGuard is Guard for WithoutFenceColumn: the holder forged for
// this one lease is matched instead of a fence.
const UnfencedGuard = `SELECT 1 / count(*) FROM (
  SELECT 1 FROM {table}
   WHERE key = $1 AND holder = $2 COLLATE "C" AND tableoid = $3 AND expires_at > clock_timestamp()
     FOR SHARE
) AS this_lease`

// GuardRefused aborts the transaction of a Guard that failed without the
// server having refused it (the lease already ended, the context ended
// before the guard statement was sent, the reply was lost): every failure of
// Guard must leave its transaction unable to commit, since a caller that
// ignores the error would otherwise commit an old lease's writes. Any
// error inside a transaction aborts it; this one names why. The error is
// raised at run time by the server, whatever the statement cache does.
const GuardRefused = `DO $$ BEGIN RAISE EXCEPTION USING MESSAGE = 'pglease: guard refused: this transaction writes for a lease that is no longer held, and can only roll back'; END $$`
