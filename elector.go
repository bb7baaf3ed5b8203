package pglease

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"github.com/go-co-op/gocron/v2"
)

var _ gocron.Elector = (*Elector)(nil)

// Elector elects one leader among the replicas of a service, for
// gocron.WithDistributedElector: only the leader runs jobs. Leadership is a
// lease on one key (WithLeaderKey) of the same table, kept alive by the same
// heartbeat machinery as a Locker's leases.
type Elector struct {
	locker *Locker
	key    string

	mu    sync.Mutex
	lease *Lease // the current mandate, or nil
}

// NewElector returns an Elector on db. It takes the same options as
// NewLocker, plus WithLeaderKey; WithMinHold is ignored, so that Close hands
// leadership over at once. Invalid options panic, naming the option.
func NewElector(db DB, opts ...Option) *Elector {
	// Applied last, before NewLocker builds the protocol (which copies the
	// min hold into the release statement's arguments) and validates it.
	l := NewLocker(db, append(slices.Clip(opts), WithMinHold(0))...)
	return &Elector{locker: l, key: l.cfg.leaderKey}
}

// IsLeader implements gocron.Elector. While this replica's leadership lease
// is within its trust window it answers without a round trip. Otherwise it
// claims the leader key (within the Locker's timeout): it returns nil when
// this replica becomes the leader, reported as EventElected with the new
// fence, and an error wrapping ErrHeld while another replica leads.
func (e *Elector) IsLeader(ctx context.Context) error {
	mustContext(ctx, "IsLeader")
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease != nil && e.lease.Err() == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, e.locker.cfg.timeout)
	defer cancel()
	lease, err := e.locker.Claim(ctx, e.key)
	if err != nil {
		e.lease = nil
		return fmt.Errorf("pglease: is leader: %w", err)
	}
	e.lease = lease
	e.locker.emit(Event{Kind: EventElected, Key: e.key, Holder: lease.Holder(), Fence: lease.Fence()})
	return nil
}

// Leader returns this replica's leadership lease while it leads: its fence
// orders the mandates of successive leaders.
func (e *Elector) Leader() (*Lease, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.lease == nil || e.lease.Err() != nil {
		return nil, false
	}
	return e.lease, true
}

// Close resigns: the leadership lease is released at once, so a follower
// takes over at its next IsLeader without waiting for the TTL. Then the
// heartbeat stops. Close is idempotent.
func (e *Elector) Close(ctx context.Context) error {
	err := e.locker.Close(ctx)
	if errors.Is(err, ErrLost) {
		return nil // it was no longer leading: nothing to hand over
	}
	return err
}
