package sqlstmt

// LostRows reads the rows of the keys ($1) whose leases a heartbeat round,
// a release or a Guard found no longer matching, so that each loss reads
// as what it is: revoked by an operator, taken by a later lease, expired
// early by an operator, or lapsed.
//
//   - Revoke writes the revoke marker into holder and keeps the fence: a
//     row whose holder is the marker and whose fence is the lease's own is
//     that very mandate, revoked. A row re-claimed since has a new fence
//     and holder, and reads as the later mandate it is.
//   - expires_at, and whether it is past by the server's clock: a row still
//     the lease's (holder and fence) that expired before the expiry the
//     lease was last given was expired early by an operator (ForceExpire);
//     one that expired at or after it lapsed.
//   - A plain read, no lock, sent only when a lease was found gone (never
//     in a round that extended every lease): the loss is decided already
//     by the statement that found the row gone, this read only words it.
//   - fence goes through to_jsonb, as in List, so that a table without a
//     fence column (WithoutFenceColumn) reads too, with a NULL fence;
//     COALESCE: a table that lets holder be NULL reads as no holder.
const LostRows = `SELECT key, COALESCE(holder, ''), (to_jsonb(t) ->> 'fence')::bigint,
       expires_at, expires_at > clock_timestamp()
  FROM {table} AS t WHERE key = ANY($1::text[])`
