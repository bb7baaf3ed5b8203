// Package pglease runs a job scheduled on several replicas on exactly one of
// them, and gives that run a fencing token that only grows. It is a lease
// table in PostgreSQL and a Locker that plugs into gocron
// (gocron.WithDistributedLocker).
//
// # The row
//
// Each key (a gocron job name) has one row: holder, fence, acquired_at and
// expires_at. The row is created by the first claim of the key and then
// updated in place for ever; only Migrate's purge ever deletes it, long after
// it expired. Every time is the database's clock_timestamp(): the Go clock of
// a replica is never compared with anything but itself.
//
// # Claim
//
// A claim is one INSERT ... ON CONFLICT DO UPDATE. It takes the row when
// there is none, when the row has expired, or when this holder already holds
// it (a re-entrant claim). Every successful claim takes a new fence from a
// sequence, so the fence of a key grows with each mandate, even across a
// purge. When another holder's lease is live, no row comes back and Claim
// returns ErrHeld. When the claim had to wait on the row lock for longer than
// the TTL, the row comes back already expired: that is not a lease, and
// Claim hands out nothing (an error wrapping ErrLost).
//
// # Heartbeat and the trust window
//
// A Locker runs one background goroutine. Every heartbeat interval, timed
// from the start of the previous round, it extends all the leases it holds
// in one statement that matches each row on holder, fence and "not yet
// expired". A row locked by another transaction is skipped, not waited for,
// and retried a quarter interval later: it costs its own lease at most,
// never the others. A lease whose row no longer matches has been taken by a
// later mandate or has lapsed: it is lost at once, its Done channel closes
// and its Err wraps ErrLost. A lost lease never comes back.
//
// The Locker trusts a lease until its trust deadline: the local time at
// which the last successful claim or heartbeat was sent, plus the TTL, minus
// a margin of a tenth of the TTL (at most a second). The server computed
// that statement's expiry later than it was sent, so the trust deadline
// falls before the server's expiry by at least the margin, as long as the
// local clock does not run slow against the server's. The margin absorbs
// the rest: over one TTL, the time the local clock loses against the
// server's plus the lateness of the timer that ends the lease must stay
// below the margin. That is a clock up to 10% slow for a TTL of 10s or
// less, and 1s per TTL beyond (1.7% at the default 60s). A fast local clock
// only ends leases early.
//
// The deadline is reckoned on the monotonic clock and on the wall clock, and
// the lease ends when either has passed it, so the bound above need only
// hold for one of them. The monotonic clock, and Go's timers with it, stands
// still while the host or VM is suspended; the wall clock counts the
// suspend. So a watchdog, one timer per Locker, checks every held lease once
// per margin: after a resume the lease ends within one margin, and Err and
// Held, which check both clocks, say so at once. A wall clock stepped
// forward (NTP) ends leases early, which is safe; one stepped back leaves
// the monotonic deadline in force.
//
// The timer ends the lease at its deadline, database reachable or not, even
// while the heartbeat goroutine waits behind a release that hangs. A failed
// heartbeat is retried every quarter interval. The heartbeat interval must
// be below TTL/2, so a single failed round is always retried in time.
//
// # Release
//
// Unlock ends the lease locally first (from the moment the release is on its
// way the server may let another holder in), then expires the row in place
// rather than deleting it, guarded by holder and fence: a previous mandate's
// late release touches nothing and returns ErrLost. With WithMinHold the release keeps the lease until
// acquired_at + min hold, so a replica whose scheduler fires a few
// milliseconds later cannot run the same tick again; the holder itself may
// re-claim. Releases and heartbeat rounds are ordered by a gate: a
// heartbeat already in flight completes before a release is sent, so it
// cannot re-arm a lease that was just released, while releases of different
// leases run side by side.
//
// # One WAL flush per job run
//
// A claim must be durable before its job runs: were it lost in a crash, the
// sequence could issue its fence again. A heartbeat must be durable too: a
// lost extension would let another replica claim while the holder still
// trusts its lease. A release need not be. If a crash loses it, the row
// keeps its last durable expiry, so the lease merely lasts until then (the
// key is idle for up to one TTL): liveness, never safety. And any later
// synchronous commit, such as the next claim, flushes the WAL up to and
// including the release, so a release can only be lost together with
// everything after it. The release statement therefore sets
// synchronous_commit to off for its own transaction, and a job run costs
// one WAL flush (the claim) instead of two.
//
// Unlock runs even when its context is already cancelled (gocron cancels it
// on shutdown), bounded by the Locker's timeout, and reports failures through
// the logger and hooks, because gocron ignores what Unlock returns.
//
// # Failures
//
//   - Database unreachable: claims fail (reported at error level, not as
//     contention); held leases are lost at their trust deadline.
//   - Holder crash: its leases expire after at most one TTL; another replica
//     claims with a greater fence.
//   - Holder paused (GC, VM): its lease may expire and be taken meanwhile.
//     On resume the heartbeat finds another fence and reports the loss;
//     the late release touches nothing.
//   - Server restart: leases survive if it is back within the trust window.
//
// # Contexts
//
// Every method that takes a context panics on a nil one, naming the method,
// before anything is sent or changed.
//
// # Model
//
// model/lease.pml is a SPIN model of this protocol; docs/MODEL.md says what
// it proves (no two believed mandates at once, late operations touch no
// newer mandate, fences only grow, the key is eventually claimed) within
// which bounds, and which assumptions each guarantee needs: PostgreSQL
// serves a row's lock waiters in order, and a replica's clock runs slow by
// no more than the trust margin over one TTL. One behaviour no guarantee
// forbids: a heartbeat abandoned at its trust deadline may still run on the
// server after the lease's release and, with a min hold, keep the row for
// one more TTL. Nobody believes in that lease any more; the key is only
// idle longer.
//
// # What fencing protects
//
// A lease guarantees one mandate at a time only as far as the clocks and
// the database are honest. A paused process cannot know it was paused: work
// it does after its lease ended is only stopped by a downstream that checks
// the fence (rejects a write carrying a fence lower than one it has seen).
// Pass Fence to such resources. Across a PostgreSQL failover the guarantees
// hold only with synchronous replication: an asynchronous standby may not
// have the latest claim, and could issue an older fence again.
package pglease
