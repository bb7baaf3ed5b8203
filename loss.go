package pglease

import (
	"context"
	"fmt"
	"time"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// lostReadTimeout bounds the read that tells a revoked lease from one a
// later lease took: the loss is not declared before it returns, so a
// server that has just answered the statement that found the row gone, and
// then stalls, delays the loss by this much at most.
const lostReadTimeout = 250 * time.Millisecond

// revokedOf returns the leases, among those a heartbeat round or a release
// found gone (leases not in found), whose rows an operator revoked: the
// row's holder is RevokedHolder and its fence the lease's own (any fence,
// on a table without one). It sends nothing when no lease is gone, and
// reports none revoked when the read fails: the loss then reads as the
// generic one, which it still is.
func (l *Locker) revokedOf(ctx context.Context, db DB, leases []*Lease, gone func(*Lease) bool) map[*Lease]bool {
	var keys []string
	for _, ls := range leases {
		if gone(ls) {
			keys = append(keys, ls.key)
		}
	}
	if len(keys) == 0 {
		return nil
	}
	t, err := parseTable(l.cfg.table)
	if err != nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, lostReadTimeout)
	defer cancel()
	rows, err := db.Query(ctx, t.render(sqlstmt.LostRows), keys)
	if err != nil {
		return nil
	}
	defer rows.Close()
	revokedFence := make(map[string]*int64)
	for rows.Next() {
		var (
			key, holder string
			fence       *int64
		)
		if rows.Scan(&key, &holder, &fence) != nil {
			return nil
		}
		if holder == RevokedHolder {
			revokedFence[key] = fence
		}
	}
	if rows.Err() != nil || len(revokedFence) == 0 {
		return nil
	}
	out := make(map[*Lease]bool)
	for _, ls := range leases {
		// Without a fence column (WithoutFenceColumn) the forged holder
		// was the lease, and the marker replaced it: any fence matches.
		if fence, ok := revokedFence[ls.key]; ok && gone(ls) && (l.cfg.noFence || fence == nil || *fence == ls.fence) {
			out[ls] = true
		}
	}
	return out
}

// lostInRound ends ls, which a heartbeat round found gone: revoked by an
// operator (ErrRevoked), or re-claimed or lapsed (ErrLost).
func (ls *Lease) lostInRound(revoked bool) {
	if revoked {
		ls.loseTo("heartbeat found its row's holder is the revoke marker "+RevokedHolder, ErrRevoked)
		return
	}
	ls.lose("heartbeat found the row re-claimed or lapsed")
}

// loseTo is lose with the sentinel the error wraps: ErrLost, or ErrRevoked
// (which is ErrLost too).
func (ls *Lease) loseTo(why string, sentinel error) {
	err := fmt.Errorf("pglease: lease %q fence %d: %s: %w", ls.key, ls.fence, why, sentinel)
	ls.end(err, func() {
		ls.locker.emit(Event{Kind: EventLost, Key: ls.key, Holder: ls.holder, Fence: ls.fence, Err: err})
	})
}

// goneOnRelease is the outcome of a release that found its row gone:
// revoked by an operator (ErrRevoked), or taken by a later lease or
// lapsed (ErrLost).
func goneOnRelease(revoked bool) error {
	if revoked {
		return fmt.Errorf("its row's holder is the revoke marker %s: %w", RevokedHolder, ErrRevoked)
	}
	return fmt.Errorf("row taken by a later lease or lapsed: %w", ErrLost)
}
