package pgleaseotel

import (
	"context"
	"errors"

	"github.com/jackc/pgx/v5/pgconn"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pglease/pglease"
)

// The attributes pglease's spans and metrics carry (see the package doc).
// The db.* ones and error.type follow OpenTelemetry's semantic conventions
// for database clients; OpenTelemetry defines none for locks or leases, so
// the others are pglease's own.
const (
	dbSystemName     = attribute.Key("db.system.name")
	dbOperationName  = attribute.Key("db.operation.name")
	dbCollectionName = attribute.Key("db.collection.name")
	errorTypeKey     = attribute.Key("error.type")

	keyKey     = attribute.Key("pglease.key")
	fenceKey   = attribute.Key("pglease.fence")
	holderKey  = attribute.Key("pglease.holder")
	leasesKey  = attribute.Key("pglease.leases")
	outcomeKey = attribute.Key("pglease.outcome")
)

var dbSystemPostgreSQL = dbSystemName.String("postgresql")

// Values of pglease.outcome.
const (
	outcomeAcquired = "acquired"  // claims: a lease was issued
	outcomeHeld     = "held"      // claims: another holder's lease is live (ErrHeld)
	outcomeFailed   = "failed"    // claims, releases, rounds, waits: any other failure
	outcomeExtended = "extended"  // heartbeat rounds: the round's statement ran
	outcomeReleased = "released"  // releases: the row was expired in place
	outcomeLost     = "lost"      // releases: a later lease owned the key (ErrLost)
	outcomeRan      = "ran"       // ticks: this replica claimed the tick to run it
	outcomeCaughtUp = "caught_up" // ticks: this replica runs a tick whose run lapsed
	outcomeSkipped  = "skipped"   // ticks: the run of an earlier tick still held the key
)

// Operations, the values of db.operation.name: pglease's own names for
// what each statement does, as its SQL verbs (INSERT ... ON CONFLICT,
// UPDATE) would not tell a claim from a release.
const (
	opClaim     = "claim"
	opRelease   = "release"
	opHeartbeat = "heartbeat"
	opGuard     = "guard"
	opClaimWait = "claim_wait"
)

// Values of error.type besides SQLSTATEs. OpenTelemetry's conventions ask
// for a low-cardinality value; "_OTHER" is theirs for the rest.
const (
	errRevoked  = "revoked"
	errLost     = "lost"
	errClosed   = "closed"
	errTimeout  = "timeout"
	errCanceled = "canceled"
	errOther    = "_OTHER"
)

// errorType classifies err for error.type: a pglease sentinel, a context
// end, or the SQLSTATE of a PostgreSQL error (the five-character code, as
// db.response.status_code would carry it).
func errorType(err error) string {
	var pgErr *pgconn.PgError
	switch {
	case errors.Is(err, pglease.ErrRevoked): // before ErrLost, which it also is
		return errRevoked
	case errors.Is(err, pglease.ErrLost):
		return errLost
	case errors.Is(err, pglease.ErrClosed):
		return errClosed
	case errors.Is(err, context.DeadlineExceeded):
		return errTimeout
	case errors.Is(err, context.Canceled):
		return errCanceled
	case errors.As(err, &pgErr):
		return pgErr.Code
	}
	return errOther
}
