package sqlstmt

// LostRows reads the rows of the keys ($1) whose leases a heartbeat round
// or a release found no longer matching, so that a lease an operator
// revoked reads as revoked rather than as lost to another holder.
//
//   - Revoke writes the revoke marker into holder and keeps the fence: a
//     row whose holder is the marker and whose fence is the lease's own is
//     that very mandate, revoked. A row re-claimed since has a new fence
//     and holder, and reads as the later mandate it is.
//   - A plain read, no lock, sent only when a lease was found gone (never
//     in a round that extended every lease): the loss is decided already
//     by the statement that found the row gone, this read only words it.
//   - fence goes through to_jsonb, as in List, so that a table without a
//     fence column (WithoutFenceColumn) reads too, with a NULL fence;
//     COALESCE: a table that lets holder be NULL reads as no holder.
const LostRows = `SELECT key, COALESCE(holder, ''), (to_jsonb(t) ->> 'fence')::bigint
  FROM {table} AS t WHERE key = ANY($1::text[])`
