package driver

import (
	"context"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
)

// Ticks is the schedule a claim of a tick claims from: the multiples of
// Period since the Unix epoch, or (Period 0) Instants, some instants of a
// crontab around the claimer's clock. A catch-up (CatchUp not zero) claims
// that tick instead, and takes a row of that tick whose run lapsed.
type Ticks struct {
	Period   time.Duration
	Instants []time.Time
	CatchUp  time.Time
}

// Protocol is the SQL a Locker speaks to its lease rows, over plain
// values; every SQL text is a constant of internal/sqlstmt. Fenced runs
// the fenced statements: a fence column fed by a sequence. Unfenced
// (WithoutFenceColumn) works on a table it cannot alter, with a holder
// identifier forged per lease instead of a fence.
//
// Every statement but ReadRow is sent again on a serialization failure
// (RetrySerialization): where default_transaction_isolation is repeatable
// read or serializable, a claim whose ON CONFLICT meets a row a heartbeat
// or release committed after its snapshot fails so, and the failure is
// neither contention nor a loss.
type Protocol interface {
	// Claim takes key for ttl in a statement of its own, waiting on the
	// row's lock at most lockWait (0: as long as it is held); ok is false
	// when another holder's lease is live.
	Claim(ctx context.Context, db DB, key string, ttl, lockWait time.Duration) (c Claimed, ok bool, err error)
	// ClaimTick takes key for ttl for one tick of a job's schedule (the
	// instant of tk nearest the server's clock), and only if the row's tick
	// is earlier. It waits on the row's lock at most lockWait (0: as long
	// as it is held). Unfenced carries the tick in the forged holder
	// (Claimed.Holder), and has no catch-up.
	ClaimTick(ctx context.Context, db DB, key string, ttl, lockWait time.Duration, tk Ticks) (TickClaim, error)
	// Bursts reports whether ClaimAll sends many claims in one statement.
	Bursts() bool
	// ClaimAll claims keys (distinct), each for its TTL in ttls (seconds),
	// in one statement, waiting on a row's lock at most lockWait, and
	// returns what it returned for each key it took; a key missing from
	// the result is held by another holder. Only where Bursts.
	ClaimAll(ctx context.Context, db DB, keys []string, ttls []float64, lockWait time.Duration) (map[string]Claimed, error)
	// Extend runs one heartbeat round, each lease extended by its own TTL,
	// and reports, by index in ms, on each lease whose row still matched:
	// extended to a new server expiry, or locked by another transaction
	// and to be retried. The others are lost.
	Extend(ctx context.Context, db DB, ms []Lease) (map[int]Extension, error)
	// Release expires the rows of ms in one statement, each kept for its
	// own min hold, and reports, by index, on each lease whose row still
	// matched: released (true), or locked by another transaction and to be
	// sent again (false). The others were lost.
	Release(ctx context.Context, db DB, ms []Lease) (map[int]bool, error)
	// ReleaseOne is Release of one lease, in the statement that costs
	// least. Its report may be shared: the caller only reads it.
	ReleaseOne(ctx context.Context, db DB, m Lease) (map[int]bool, error)
	// ReadRow reads the lease key's row carries now, for a give-back, once
	// a transaction that holds the row has ended, waiting for it at most
	// lockWait; a key with no row carries none (not live). Unfenced has
	// none to tell.
	ReadRow(ctx context.Context, db DB, key string, lockWait time.Duration) (RowLease, error)
}

// Claimed is what a claim statement returned for its key.
type Claimed struct {
	Holder     string
	Fence      int64
	AcquiredAt time.Time
	ExpiresAt  time.Time
	Live       bool
	Table      uint32 // the oid of the table the row is in, for Guard
}

// TickClaim is what a claim of a tick found: the lease it took (Took),
// or the row as it stood (Holder, Fence, ExpiresAt, Live and RowTick say
// why it took nothing). Tick is the tick the server's clock was at.
type TickClaim struct {
	Claimed
	Took     bool
	Tick     time.Time
	RowTick  time.Time // the row's tick when refused; zero if it had none
	Released bool      // when refused: the row's lease was released by its holder
	IsRun    bool      // when refused: the row's mandate is a run of RowTick in the ledger
	// Stale: the server's clock (AcquiredAt) was outside the Instants
	// sent, and the claim took nothing.
	Stale bool
}

// Lease is a lease as a heartbeat or release statement matches its
// row: its key and its fence (Fenced) or forged holder (Unfenced), with
// its terms.
type Lease struct {
	Key        string
	Fence      int64
	Holder     string
	AcquiredAt time.Time // Unfenced counts the min hold from it
	TTL        time.Duration
	MinHold    time.Duration
	// Run is, for the lease of a job's tick, the outcome its release
	// writes in the ledger: RunCompleted, RunFailed for a run that
	// returned an error, or RunGivenBack for a claim given back; empty for
	// a lease of no tick.
	Run string
}

// The outcomes a release writes in the ledger of runs.
const (
	RunCompleted = "completed"
	RunFailed    = "failed"
	RunGivenBack = "given back"
)

// closesRuns reports whether a release of ms closes runs in the ledger.
func closesRuns(ms []Lease) bool {
	for _, m := range ms {
		if m.Run != "" {
			return true
		}
	}
	return false
}

// Extension is what a heartbeat round found for one lease.
type Extension struct {
	ExpiresAt time.Time // the new server expiry, if extended
	Locked    bool      // not extended: the row is locked by another transaction, and still matched as last committed
	ServerNow time.Time // the server's clock as the statement ran, for the clock-skew reading
}

// RowLease is the lease a row carries.
type RowLease struct {
	Holder string
	Fence  int64
	Live   bool
}

// ReleaseLockWait is how long the release of one lease waits on its row's
// lock before it counts the row skipped: far longer than a claim in
// flight holds it, far shorter than a heartbeat interval.
const ReleaseLockWait = "20ms"

// claimOutcomeOf is what the Scan of a claim statement's row says: no row
// means another holder's lease is live.
func claimOutcomeOf(c Claimed, err error) (Claimed, bool, error) {
	if errors.Is(err, pgx.ErrNoRows) {
		return c, false, nil
	}
	return c, err == nil, err
}

// seconds is each lease's TTL or min hold in seconds, as make_interval
// takes them: the array a heartbeat or release statement carries beside
// the keys, so that one statement serves leases of every TTL.
func seconds(ms []Lease, of func(Lease) time.Duration) []float64 {
	out := make([]float64, len(ms))
	for i, m := range ms {
		out[i] = of(m).Seconds()
	}
	return out
}

func ttlOf(m Lease) time.Duration     { return m.TTL }
func minHoldOf(m Lease) time.Duration { return m.MinHold }
func fenceOf(m Lease) int64           { return m.Fence }
func holderOf(m Lease) string         { return m.Holder }

// keysAnd is each lease's key and what its row is matched on (its fence,
// or its forged holder): the arrays a heartbeat or release statement
// carries.
func keysAnd[M any](ms []Lease, match func(Lease) M) ([]string, []M) {
	keys := make([]string, len(ms))
	out := make([]M, len(ms))
	for i, m := range ms {
		keys[i], out[i] = m.Key, match(m)
	}
	return keys, out
}

// readReport reads what a heartbeat or release statement reported, one row
// per lease whose row still matched: its key, what it is matched on, and
// what the statement did to it (V, read into the columns fields gives).
// A row counts only for the lease of that key and that very match. A
// lease reported neither way is left out: it is lost.
func readReport[M comparable, V any](rows pgx.Rows, ms []Lease, match func(Lease) M, fields func(*V) []any) (map[int]V, error) {
	defer rows.Close()
	byKey := make(map[string]int, len(ms))
	for i, m := range ms {
		byKey[m.Key] = i
	}
	got := make(map[int]V, len(ms))
	// Every row is scanned into the same destinations, made once per
	// statement rather than once per row, and zeroed before each row (a
	// pointer field is then scanned into a new value, never one that an
	// earlier row's report holds).
	var row struct {
		key  string
		m    M
		what V
	}
	what := fields(&row.what)
	dest := append(append(make([]any, 0, 2+len(what)), &row.key, &row.m), what...)
	blank := row
	for rows.Next() {
		row = blank
		if err := rows.Scan(dest...); err != nil {
			return nil, err
		}
		if i, ok := byKey[row.key]; ok && match(ms[i]) == row.m {
			got[i] = row.what
		}
	}
	return got, rows.Err()
}

// releaseReported sends sql, a release statement of ms, and reads its
// report (readReport). A statement whose rows came back and whose commit
// then failed with 55P03 (its lock wait passed while the commit waited for
// the notification queue's lock: nothing was released) is sent again at
// once as quiet, the same statement without its notification. A 55P03
// before any row (a lock on the table past the wait) reports every lease
// skipped, to be sent again later.
func releaseReported[M comparable](ctx context.Context, db DB, sql, quiet string, ms []Lease, match func(Lease) M, args ...any) (map[int]bool, error) {
	send := func(sql string) (map[int]bool, error) {
		rows, err := db.Query(ctx, sql, args...)
		if err != nil {
			return nil, err
		}
		return readReport(rows, ms, match, releaseFields)
	}
	got, err := send(sql)
	if Is(err, LockNotAvailable) && len(got) > 0 {
		got, err = send(quiet)
	}
	if Is(err, LockNotAvailable) {
		got = make(map[int]bool, len(ms))
		for i := range ms {
			got[i] = false
		}
		return got, nil
	}
	return got, err
}

// heartbeatRow is what a heartbeat statement reports on one lease: its new
// expiry, or NULL when its row was skipped because locked, and the
// server's clock.
type heartbeatRow struct {
	expiresAt *time.Time
	now       time.Time
}

func heartbeatFields(r *heartbeatRow) []any { return []any{&r.expiresAt, &r.now} }

// releaseFields reads whether a release statement released the row (true)
// or skipped it because locked (false).
func releaseFields(released *bool) []any { return []any{released} }

// extensions is a heartbeat statement's report (readReport) as
// extensions.
func extensions(got map[int]heartbeatRow, err error) (map[int]Extension, error) {
	if err != nil {
		return nil, err
	}
	out := make(map[int]Extension, len(got))
	for i, r := range got {
		if r.expiresAt == nil {
			out[i] = Extension{Locked: true, ServerNow: r.now}
		} else {
			out[i] = Extension{ExpiresAt: *r.expiresAt, ServerNow: r.now}
		}
	}
	return out, nil
}

// retried is the result of send, sent again on a serialization failure
// (RetrySerialization).
func retried[T any](ctx context.Context, send func() (T, error)) (T, error) {
	var out T
	err := RetrySerialization(ctx, func() error {
		var err error
		out, err = send()
		return err
	})
	return out, err
}
