// Package fakedriver is an in-memory lease table and the fenced protocol
// (driver.Fenced) spoken to it, for tests of the logic above the driver
// that need no server: a Locker's heartbeat, release and claim paths run in
// microseconds, on a server clock the test moves by hand.
//
// It obeys the contract the real driver obeys on PostgreSQL, and
// internal/driver/drivertest holds both to it:
//
//   - one row per key, never deleted: a release expires it in place;
//   - fences drawn from one counter that only grows, on every claim,
//     re-entrant ones included, and also by a claim that then fails, as a
//     sequence's draws are never rolled back;
//   - a claim takes a missing row, an expired one or the holder's own, and
//     refuses another holder's live row; a heartbeat or release acts only
//     on the row whose holder and fence still match and that is still
//     live;
//   - the only clock is the table's (Clock), read once per statement, in
//     whole microseconds as timestamptz keeps it, and a microsecond later
//     for the next statement; a TTL or a min hold is rounded to the
//     microsecond, as make_interval rounds it;
//   - CHECK (expires_at > acquired_at) is enforced: a write that would
//     break it fails the whole statement with SQLSTATE 23514.
//
// Rows locked by another transaction are the test's to make (Table.Lock):
// heartbeats and releases skip them and say so, claims wait for them.
// What it leaves out: locks taken by its own statements (two statements of
// the fake never wait for each other: each runs whole under one mutex),
// the release of one lease's short wait for a locked row, notifications,
// snapshots older than the statement, and the parts of the ledger of runs
// that no statement of the protocol reads back (the closing of a run by
// the next claim, the entries of skipped ticks).
//
// The files, one concept each:
//
//   - table.go: the table, its fence counter, its ledger, and the reading
//     of a row as stored;
//   - clock.go: the server's clock, moved by hand;
//   - driver.go: the protocol of one holder on a table (claims,
//     heartbeats, releases, the read of a row's lease);
//   - tick.go: the claim of a tick of a job's schedule;
//   - lock.go: a row locked by another transaction;
//   - fault.go: a statement made to fail, before or after it ran;
//   - gate.go: a statement held until the test lets it go on.
package fakedriver
