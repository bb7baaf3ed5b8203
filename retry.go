package pglease

import (
	"context"
	"time"

	"github.com/pglease/pglease/internal/driver"
)

// retrySerialization sends each statement of p again when the server fails
// it with a serialization failure (SQLSTATE 40001), and on nothing else.
//
// Where default_transaction_isolation is repeatable read or serializable,
// every statement runs in such a transaction: a claim whose ON CONFLICT
// meets a row that a heartbeat or release committed after its snapshot
// fails with "could not serialize access due to concurrent update", and
// serializable transactions also fail on read/write dependencies. Each
// statement is a transaction of its own that wrote nothing, so sending it
// again is safe and answers with a fresh snapshot. The failure is neither
// contention nor a loss, and must not be reported as either. The trust
// deadline of a lease counts from before the first attempt, so a retry only
// shortens it.
func retrySerialization(p protocol) protocol { return serializationRetry{p} }

type serializationRetry struct{ protocol }

func (r serializationRetry) claim(ctx context.Context, db DB, key string, ttl time.Duration) (c claimed, ok bool, err error) {
	err = driver.RetrySerialization(ctx, func() error {
		c, ok, err = r.protocol.claim(ctx, db, key, ttl)
		return err
	})
	return c, ok, err
}

// claimWithin retries the bounded claim of a protocol without the burst's
// statement (unfenced.claimWithin) as claim does.
func (r serializationRetry) claimWithin(ctx context.Context, db DB, key string, ttl, lockWait time.Duration) (c claimed, ok bool, err error) {
	err = driver.RetrySerialization(ctx, func() error {
		c, ok, err = r.protocol.(boundedClaimer).claimWithin(ctx, db, key, ttl, lockWait)
		return err
	})
	return c, ok, err
}

func (r serializationRetry) extend(ctx context.Context, db DB, leases []*Lease) (got map[*Lease]extension, err error) {
	err = driver.RetrySerialization(ctx, func() error {
		got, err = r.protocol.extend(ctx, db, leases)
		return err
	})
	return got, err
}

func (r serializationRetry) release(ctx context.Context, db DB, leases []*Lease) (released map[*Lease]bool, err error) {
	err = driver.RetrySerialization(ctx, func() error {
		released, err = r.protocol.release(ctx, db, leases)
		return err
	})
	return released, err
}
