// Package driver is how pglease sends its statements to PostgreSQL, the
// statements themselves being internal/sqlstmt's:
//
//   - protocol.go, fenced.go, unfenced.go: what a Locker sends to its lease
//     rows (claim, burst, heartbeat, release, the read of a row's lease),
//     over plain values, with or without the fence column;
//   - admin.go, migrate.go: what Admin and Migrate send: the table's
//     rows and runs read, a row revoked or expired, the schema made and
//     the old rows purged, each on one connection;
//   - conn.go: the connection each kind of statement (claim, heartbeat,
//     release) runs on, from a *pgxpool.Pool, a database/sql pool, or the
//     one connection given, and how many claims may hold at once;
//   - cancel.go: a claim whose caller gives up is cancelled on the server
//     and its answer read, so that its outcome stays known;
//   - claimrow.go: a claim's row, decoded in place from pgx's binary values;
//   - outcome.go: what a failed statement may have written (done, not
//     sent, unknown), and a success read after its context ended is
//     unknown;
//   - retry.go: a statement failed by a serialization failure is sent
//     again;
//   - sqlstate.go: the server's errors pglease acts on, by SQLSTATE;
//   - sqldb.go, sqlliteral.go: a *sql.DB served as a pgx pool, its
//     arguments written in the statement's text for lib/pq.
package driver
