package pglease

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/coalesce"
	"github.com/pglease/pglease/internal/driver"
)

// Between two attempts to release a row locked by another transaction, the
// wait starts at firstLockedRetry and doubles up to maxLockedRetry. Claims of
// other replicas that met the row while it changed hands lock it for their
// commit, which does not wait for a WAL flush (sqlstmt.Claim): an Unlock
// alone waits that out inside its statement (sqlstmt.ReleaseOne), and a
// burst, which skips the row, gets it on its next attempt, a millisecond
// later. A long transaction (an operator's, a guarded job's) costs a few
// statements in its first quarter second, then four a second.
const (
	firstLockedRetry = time.Millisecond
	maxLockedRetry   = 250 * time.Millisecond
)

// releaseAll ends every lease with ended and expires their rows together,
// and reports each lease's outcome as release does. A lease whose release
// was already attempted (a concurrent Unlock) is left to it. It returns the
// outcome of each lease released here.
func (l *Locker) releaseAll(ctx context.Context, leases []*Lease, ended error) []error {
	batch := make([]releasing, 0, len(leases))
	for _, ls := range leases {
		if r, first := ls.startRelease(ended); first {
			batch = append(batch, r)
		}
	}
	if len(batch) == 0 {
		return nil
	}
	out := l.releaseRows(ctx, batch)
	errs := make([]error, len(batch))
	for i, r := range batch {
		errs[i] = l.finishRelease(ctx, r, cmp.Or(r.prior, out[r.ls]))
	}
	return errs
}

// releaseRows sends the release statement for batch, and again for the rows
// it found locked by another transaction, waiting a little longer each time,
// until every row is released or lost or ctx ends. Each attempt waits for
// any heartbeat round in flight and keeps the next one out only for its own
// round trip: no attempt waits on a row lock. It returns each lease's
// outcome: nil when released.
func (l *Locker) releaseRows(ctx context.Context, batch []releasing) map[*Lease]error {
	out := make(map[*Lease]error, len(batch))
	pending := make([]*Lease, len(batch))
	for i, r := range batch {
		pending[i] = r.ls
	}
	wait := firstLockedRetry
	for {
		got, err := l.releaseOnce(ctx, pending)
		if err != nil {
			for _, ls := range pending {
				out[ls] = err
			}
			return out
		}
		losses := l.lossesOf(ctx, l.conns.Release(), pending, func(i int) bool { _, found := got[i]; return !found })
		var locked []*Lease
		for i, ls := range pending {
			released, found := got[i]
			switch {
			case !found:
				out[ls] = goneOnRelease(losses[i])
			case released:
				out[ls] = nil
			default:
				locked = append(locked, ls)
			}
		}
		if len(locked) == 0 {
			return out
		}
		pending = locked
		select {
		case <-ctx.Done():
			err := fmt.Errorf("row locked by another transaction, or its statement cancelled, until the release gave up (it lapses at its expiry): %w", context.Cause(ctx))
			for _, ls := range pending {
				out[ls] = err
			}
			return out
		case <-time.After(wait):
		}
		wait = min(2*wait, maxLockedRetry)
	}
}

// releaseOnce sends the release statement once no heartbeat round is in
// flight. While it is let in, the round waits: there it waits for nothing
// but its statement. A connection it cannot have at once (driver.Conns.ReleaseNow)
// it waits for outside, and then comes in again.
func (l *Locker) releaseOnce(ctx context.Context, leases []*Lease) (map[int]bool, error) {
	var had driver.PoolConn // a pool connection waited for outside
	if l.conns.ReleasesWait() {
		var err error
		if had, err = l.conns.AwaitRelease(ctx, nil); err != nil {
			return nil, err
		}
	}
	for {
		if err := l.gate.EnterRelease(ctx); err != nil {
			if had != nil {
				had.Release()
			}
			return nil, fmt.Errorf("waiting for the heartbeat in flight: %w", err)
		}
		db, back := l.conns.ReleaseNow(ctx, had)
		if db != nil {
			got, err := l.releaseStatement(ctx, db, leases)
			l.conns.Released(ctx, db)
			l.gate.LeaveRelease()
			return got, err
		}
		l.gate.LeaveRelease()
		var err error
		if had, err = l.conns.AwaitRelease(ctx, back); err != nil {
			return nil, err
		}
	}
}

// releaseResult is what the statement that carried one release said of it.
type releaseResult struct {
	err   error // the release's outcome: cmp.Or(prior, the statement's)
	alone bool  // not settled by that statement: send it again alone
}

// newReleases is the coalescer of a Locker's Unlocks: released together
// when they arrive while other releases are in flight, in one release
// statement, as Close releases every lease.
func (l *Locker) newReleases() *coalesce.Coalescer[releasing, releaseResult] {
	return &coalesce.Coalescer[releasing, releaseResult]{Send: l.sendReleases, Limit: maxAloneInFlight}
}

// sendRelease expires r's row, alone or with the other releases of a
// burst, ordered after any heartbeat round in flight, and returns the
// outcome as releaseRows does.
func (l *Locker) sendRelease(ctx context.Context, r releasing) error {
	if l.releases == nil {
		return l.releaseAlone(ctx, r)
	}
	o, _, err := l.releases.Do(ctx, r)
	switch {
	case err != nil:
		// Sent or not, the lease has ended; at worst its row lapses at its
		// expiry.
		return cmp.Or(r.prior, fmt.Errorf("waiting for the release statement in flight: %w", err))
	case o.alone:
		return l.releaseAlone(ctx, r)
	}
	return o.err
}

// releaseAlone releases r on its own, sent again while its row is locked.
func (l *Locker) releaseAlone(ctx context.Context, r releasing) error {
	return cmp.Or(r.prior, l.releaseRows(ctx, []releasing{r})[r.ls])
}

// sendReleases is the coalescer's statement: the release statement once
// for every release of batch (releaseOnce). The releases it could not
// settle go again one by one, outside the coalescer (releaseRows): a row
// locked elsewhere (skipped, sent again until released), a second lease of
// a key in the burst (the statement reports by key), or a statement failed
// on an error one row may cause (driver.RowError). A locked row never holds
// up the others, nor a place in flight; the release statement never waits
// on a row lock, so a burst of releases cannot deadlock with claims.
func (l *Locker) sendReleases(ctx context.Context, batch []releasing, out []releaseResult) {
	first := make(map[string]int, len(batch)) // each key's first lease, by index in leases
	leases := make([]*Lease, 0, len(batch))
	for _, r := range batch {
		if _, ok := first[r.ls.key]; !ok {
			first[r.ls.key] = len(leases)
			leases = append(leases, r.ls)
		}
	}
	got, err := l.releaseOnce(ctx, leases)
	var losses map[int]loss
	if err == nil {
		losses = l.lossesOf(ctx, l.conns.Release(), leases, func(i int) bool { _, found := got[i]; return !found })
	}
	for i, r := range batch {
		j := first[r.ls.key]
		released, found := got[j]
		switch {
		case leases[j] != r.ls, err != nil && driver.RowError(ctx, err), err == nil && found && !released:
			out[i].alone = true
		case err != nil:
			out[i].err = cmp.Or(r.prior, err)
		case !found:
			out[i].err = cmp.Or(r.prior, goneOnRelease(losses[j]))
		default:
			out[i].err = cmp.Or(r.prior, nil)
		}
	}
}

// release ends the lease with ended (ErrReleased or ErrClosed), then
// expires its row, ordered after any heartbeat round in flight.
//
// The lease ends before the release is sent: once it is on its way the
// server may let another holder in, so from that moment nobody may believe
// in it (Err, Held, Done and Context all say so). A lease already lost keeps
// its loss, and Unlock returns it.
func (l *Locker) release(ctx context.Context, ls *Lease, ended error) error {
	r, first := ls.startRelease(ended)
	if !first {
		return r.err
	}
	return l.finishRelease(ctx, r, l.sendRelease(ctx, r))
}

// releasing is one lease on its way out.
type releasing struct {
	ls        *Lease
	prior     error     // the loss that had ended it before, if any: the release reports it (for instance past its trust deadline while the database was unreachable)
	endedHere bool      // this release ended it
	err       error     // when not first: the outcome of the release already made
	at        time.Time // when it started: its event's Took counts from it
}

// startRelease marks the lease released and ends it with ended unless it
// had ended already. first is false when a release was attempted before:
// r.err is then its outcome.
func (ls *Lease) startRelease(ended error) (r releasing, first bool) {
	ls.mu.Lock()
	if ls.released {
		err := ls.releaseErr
		ls.mu.Unlock()
		return releasing{ls: ls, err: err}, false
	}
	ls.released = true
	// Recorded before anyone can see the lease released: waiting claims
	// wait for it (registry.releaseOf), and so does Close.
	ls.locker.reg.releaseStarted(ls)
	ls.mu.Unlock()

	prior := ls.lostErr()
	return releasing{ls: ls, prior: prior, endedHere: prior == nil && ls.end(ended, nil), at: time.Now()}, true
}

// finishRelease reports the outcome err of the release r, records it for
// later Unlocks, and returns it wrapped.
func (l *Locker) finishRelease(ctx context.Context, r releasing, err error) error {
	ls, took := r.ls, time.Since(r.at)
	if err == nil {
		// Reported only if this release ended the lease: one that ran out
		// of trust meanwhile was reported lost already.
		if r.endedHere {
			l.cfg.emit(Event{Kind: EventReleased, Key: ls.key, Holder: ls.holder, Fence: ls.fence, Took: took, Context: ctx})
		}
	} else {
		// The lease is no longer extended either way, so at worst its row
		// lapses at its expiry.
		err = fmt.Errorf("pglease: unlock %q fence %d: %w", ls.key, ls.fence, err)
		l.cfg.emit(Event{Kind: EventReleaseFailed, Key: ls.key, Holder: ls.holder, Fence: ls.fence, Err: err, Took: took, Context: ctx})
	}
	ls.mu.Lock()
	ls.releaseErr = err
	ls.mu.Unlock()
	l.reg.releaseFinished(ls)
	return err
}

// releaseStatement expires the rows of leases on db in one statement
// (driver.Protocol.Release), one lease's in the statement that costs least
// (ReleaseOne), and reports by index in leases.
func (l *Locker) releaseStatement(ctx context.Context, db DB, leases []*Lease) (map[int]bool, error) {
	if len(leases) == 1 {
		return l.proto.ReleaseOne(ctx, db, leases[0].row())
	}
	return l.proto.Release(ctx, db, rowsOf(leases))
}

// giveBackUnknown gives back what a claim of key may have committed unseen:
// once no transaction holds the row (the claim's own may still commit), it
// expires it on exactly its fence if it is this holder's, live, with a fence
// above drawn (claim), within the claim's key turn, even once ctx has ended
// (within givenUpGiveBack). It returns what may be left behind, for Close
// to name: no row of the claim found, or one maybe an earlier claim's. A
// claim answered after its context ended (driver.Answered) wrote all it
// will before the read, so finding no row of it leaves nothing.
func (l *Locker) giveBackUnknown(ctx context.Context, key string, t terms, drawn int64, answered bool) error {
	if l.cfg.noFence {
		return errors.New("its claim's outcome is unknown, and a row without a fence cannot be given back: if written, it lapses at its expiry")
	}
	limit := t.timeout
	if ctx.Err() != nil {
		limit = givenUpGiveBack // the caller has given up: it waits this long again, whatever its timeout
	}
	rctx, cancel := l.giveBackContext(ctx, limit)
	defer cancel()
	m, err := l.proto.ReadRow(rctx, l.conns.ClaimRead(), key, limit/2) // half: the release follows
	if driver.Is(err, driver.LockNotAvailable) {
		return fmt.Errorf("its row locked by another transaction past the read's wait of %v, it lapses at its expiry: %w", limit/2, err)
	} else if err != nil {
		return fmt.Errorf("reading the lease its row carries: %w", err)
	}
	// This claim's row (claims of a key take turns), or a late one of an
	// earlier claim of the key whose outcome was never learned (mayLand).
	found := m.Holder == l.cfg.holder && m.Fence > drawn
	earlier := l.reg.mayLand(key, found || answered)
	var kept error // the found row's, if its give-back failed: a *leftBehindError
	if found {
		l.sawDrawn(m.Fence)
		if m.Live {
			kept = l.giveBack(rctx, &Lease{key: key, holder: m.Holder, fence: m.Fence, terms: t})
		}
	}
	switch {
	case !found && answered:
		return nil
	case !found:
		return errors.New("its claim's outcome is unknown and no row of it was there to expire: " +
			"if the statement still reaches the server, its row lapses at its expiry")
	case earlier:
		err := fmt.Errorf("its claim's outcome is unknown, and the row of fence %d may be an earlier claim's whose outcome was never learned: "+
			"if its own statement still reaches the server, its row lapses at its expiry", m.Fence)
		if n := (*leftBehindError)(nil); errors.As(kept, &n) {
			err = fmt.Errorf("%w; and %w", err, n.err)
		}
		// No fence: the row of its own statement may come yet, though
		// the row found lapses (stillLeft).
		return &leftBehindError{key: key, err: err}
	}
	return kept
}

// giveBack expires the row of ls, a lease nobody holds, keeping its min
// hold, in one attempt of the release statement. It returns an error if the
// row may be left live (locked elsewhere, it lapses at its expiry).
func (l *Locker) giveBack(ctx context.Context, ls *Lease) error {
	ls.givenBack = true // set before the Lease is seen by anyone else
	rctx, cancel := l.giveBackContext(ctx, ls.terms.timeout)
	defer cancel()
	report, err := l.releaseStatement(rctx, l.conns.Release(), []*Lease{ls})
	if released, matched := report[0]; err != nil || matched && !released {
		err = cmp.Or(err, errors.New("its row locked by another transaction past the release's wait: it lapses at its expiry"))
		return &leftBehindError{ls.key, ls.fence, fmt.Errorf("fence %d: %w", ls.fence, err)}
	}
	return nil
}

// givenUpGiveBack is the longest the give-back's read of a claim whose
// caller has given up may take: Claim then returns within
// 2*driver.AnswerGrace of its context's end, a quarter second to spare on
// a loaded machine, unless it found a row to expire, which takes up to the
// claim's timeout more (giveBack).
const givenUpGiveBack = driver.AnswerGrace - driver.AnswerGrace/4

// closingGiveBack is the least a give-back sent once Close has begun may
// take: two driver.AnswerGrace, as long as Close gives a cancelled claim to end.
const closingGiveBack = 2 * driver.AnswerGrace

// giveBackContext is a give-back's context: limit from now; once Close has
// begun, on a pool, within Close's context and at least closingGiveBack
// (Close waits for it), or else within the bound Close set for all of them.
func (l *Locker) giveBackContext(ctx context.Context, limit time.Duration) (context.Context, context.CancelFunc) {
	closeCtx, until := l.reg.closing()
	switch {
	case closeCtx == nil:
		return context.WithTimeout(context.WithoutCancel(ctx), limit)
	case closeCtx.Err() == nil && l.conns.IsPool():
		return context.WithTimeout(closeCtx, max(limit, closingGiveBack))
	}
	if d := time.Now().Add(limit); d.Before(until) {
		until = d
	}
	return context.WithDeadline(context.WithoutCancel(ctx), until)
}

// leftBehind is what Close returns of a claim of key that may have written
// a row it could not expire again (err says why; nil: nothing; a
// *leftBehindError from giveBack already). A claim in flight hands it to its call
// (flight.Call.Note): Close names it if the claim returns once Close has
// begun, and the row may still be live then (stillLeft).
func leftBehind(key string, err error) error {
	if n := (*leftBehindError)(nil); err == nil || errors.As(err, &n) {
		return err
	}
	return &leftBehindError{key: key, err: err}
}

// leftBehindError is leftBehind's error.
type leftBehindError struct {
	key   string
	fence int64 // the row's, if known; 0: a row that may yet be written
	err   error
}

func (e *leftBehindError) Error() string {
	return fmt.Sprintf("pglease: close: claim %q may have written a row that could not be expired again: %v", e.key, e.err)
}
func (e *leftBehindError) Unwrap() error { return e.err }

// stillLeft keeps of notes (leftBehind's) those whose row may still be
// live: a row of known fence no longer live at that fence with this holder
// (a later claim of its key re-claimed it, or it expired) leaves nothing.
// A row that cannot be read keeps its note.
func (l *Locker) stillLeft(ctx context.Context, notes []error) []error {
	var kept []error
	for _, note := range notes {
		if n := (*leftBehindError)(nil); errors.As(note, &n) && n.fence > 0 {
			m, err := l.proto.ReadRow(ctx, l.conns.ClaimRead(), n.key, 50*time.Millisecond) // a row locked past it keeps its note
			if err == nil && (!m.Live || m.Holder != l.cfg.holder || m.Fence != n.fence) {
				continue
			}
		}
		kept = append(kept, note)
	}
	return kept
}

// orphanLeftBehind is for a claim no longer in flight (its caller left; the
// coalescer, which Close waits for, settles it): Close names it if Close
// has begun.
func (l *Locker) orphanLeftBehind(key string, err error) {
	if closeCtx, _ := l.reg.closing(); err != nil && closeCtx != nil {
		l.reg.giveUp(leftBehind(key, err))
	}
}
