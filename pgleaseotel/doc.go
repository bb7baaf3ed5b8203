// Package pgleaseotel reports what a pglease Locker does as OpenTelemetry
// metrics and spans: claims by outcome, leases held, heartbeat rounds and
// their latency, losses by cause, releases, guard refusals, waiting claims,
// Elector handovers and the clock skew.
//
// It plugs into the Locker's hook, so the core package keeps no
// OpenTelemetry dependency, and it uses only the OpenTelemetry API: the
// service brings its SDK and exporters, and passes its providers (or sets
// the global ones, the default):
//
//	tel, err := pgleaseotel.New(pgleaseotel.Opts{
//		MeterProvider:  meterProvider,
//		TracerProvider: tracerProvider,
//		Table:          "lease", // the table of every Locker it serves (WithTable)
//	})
//	locker := pglease.NewLocker(pool, pglease.WithHook(tel.Hook))
//
// One Telemetry may serve several Lockers (of one process, or on several
// tables): their counts add up. Guard, ClaimWait and Campaign report no
// event of their own: call them through the Telemetry's methods of the same
// names to see them. JobMonitor, passed to gocron.WithMonitor, counts the
// scheduler's runs beside the runs its distributed locker skipped.
//
// # Metrics
//
// Each comes from the meter named ScopeName. Units follow OpenTelemetry's
// conventions: seconds for times, a count's unit in braces.
//
//	name                               type            unit        attributes
//	pglease.claims                     counter         {claim}     pglease.outcome: acquired | held (another holder's live lease) | failed; error.type when failed
//	pglease.leases.held                up-down counter {lease}     leases held now: each counted once, a lease lost and then unlocked included
//	pglease.heartbeat.rounds           counter         {round}     pglease.outcome: extended | failed (retried until each lease's trust deadline); error.type when failed
//	pglease.heartbeat.duration         histogram       s           round trip of each round, by pglease.outcome
//	pglease.leases.lost                counter         {lease}     leases that ended without a release, by error.type: revoked (an operator's Admin.Revoke) | lost (taken, lapsed, or past its trust deadline)
//	pglease.releases                   counter         {release}   pglease.outcome: released | lost (a later lease owned the key) | failed; error.type when failed
//	pglease.ticks                      counter         {tick}      pglease.outcome: ran | caught_up (a tick whose run lapsed) | skipped (an earlier tick's run held the key)
//	pglease.guard.refusals             counter         {refusal}   transactions Guard aborted, by error.type: lost | a SQLSTATE (40001: retry) | ...
//	pglease.claim_wait.active          up-down counter {claim}     waiting claims (ClaimWait, Campaign) in progress
//	pglease.claim_wait.duration        histogram       s           from a waiting claim's start to its lease or failure, by pglease.outcome: acquired | failed (and error.type)
//	pglease.elector.elections          counter         {election}  times an Elector became the leader
//	pglease.elector.handover.duration  histogram       s           from the end of an Elector's leadership to the next leader of its key this Telemetry saw
//	pglease.clock.skew                 gauge           s           database clock minus this replica's wall clock, by the latest claim or heartbeat
//	pglease.clock.skew.uncertainty     gauge           s           the bound on its error (half the round trip of its sample)
//	pglease.job.runs                   counter         {run}       gocron job runs (JobMonitor), by pglease.job.status: success | fail | skip (Lock failed: the key was held) | ...
//	pglease.job.duration               histogram       s           time each gocron job run took (JobMonitor)
//
// The claim and release outcomes and leases held exist at zero from the
// start, so that a rate or an alert sees the first failure. A rising
// pglease.claims{pglease.outcome="failed"} is the alert to have: a claim
// that fails skips the job, and gocron logs nothing about it. Alert on
// abs(pglease.clock.skew) - pglease.clock.skew.uncertainty above half your
// min hold: see pglease.Locker.ClockSkew.
//
// A handover is timed only when this Telemetry saw both its ends: the
// Electors of both replicas in one process, or the replica that stopped
// leading campaigning on and seeing the next leader (EventNewLeader).
//
// By default no metric carries the lease key: keys are job names, and an
// attribute per key multiplies every series by the number of jobs.
// Opts.PerKey adds pglease.key to the claim, leases held, loss, release,
// waiting claim, handover and job metrics (a gocron job's name is its key) (not to heartbeat rounds, which cover
// all the leases of a Locker at once).
//
// # Spans
//
//	name                kind      from
//	pglease.claim       client    EventAcquired, EventContended, EventClaimFailed: one per claim statement
//	pglease.heartbeat   client    EventExtended, EventHeartbeatFailed: one per heartbeat
//	pglease.release     client    EventReleased, EventReleaseFailed: one per Unlock or Close of a lease
//	pglease.lost        internal  EventLost: the moment the Locker stopped trusting the lease
//	pglease.guard       client    Telemetry.Guard
//	pglease.claim_wait  internal  Telemetry.ClaimWait and Telemetry.Campaign, around all their attempts
//
// Their attributes:
//
//	db.system.name      "postgresql"
//	db.operation.name   the operation: claim | heartbeat | release | guard | claim_wait (its SQL verbs would not tell a claim from a release)
//	db.collection.name  Opts.Table, when set (an Event does not say its table)
//	error.type          on failure: revoked | lost | closed | timeout | canceled | a PostgreSQL SQLSTATE | _OTHER
//	pglease.key         the lease key (the job name); none on heartbeat rounds
//	pglease.fence       the lease's fencing token, when one was issued
//	pglease.holder      the holder: the Locker's, or the lease row's
//	pglease.leases      heartbeats: the leases in the statement
//	pglease.outcome     as in the metrics
//
// The db.* attributes and error.type follow OpenTelemetry's semantic
// conventions for database clients; OpenTelemetry defines none for locks or
// leases, so pglease.* are this package's own. A failed span has the error
// status and its message; a contended claim (held) is the normal outcome
// between replicas, not an error.
//
// The hook's spans are recorded after the fact: an event carries the round
// trip of its statement (Event.Took), so a span begins that long before the
// event and ends with it; a loss carries none and lasts no time. A claim's
// and a release's span is a child of the span in the caller's context
// (Event.Context: the job run or request that claimed or unlocked); a
// heartbeat and a loss belong to the Locker, not to a caller, and
// their spans are roots. The spans of Guard, ClaimWait and Campaign take
// the context they are given, and are children of its span.
//
// # Module
//
// pgleaseotel is a module of its own, so that importing pglease brings no
// OpenTelemetry dependency:
//
//	go get github.com/pglease/pglease/pgleaseotel
//
// Each release tags it with the root module's version (pgleaseotel/v0.5.0
// beside v0.5.0), and its go.mod requires the root module at that version
// (it reads Event.Context, new in v0.5.0).
// The replace directive in its go.mod points the root module at this
// repository's code for the checks and tests that build each module alone
// (GOWORK=off): the go command applies a replace only in the module it is
// run in, so the directive never reaches a module that imports pgleaseotel,
// which gets the required release.
//
// Before that release is tagged, a module that uses this repository's
// code (a checkout at ../pglease) needs two replace lines, the root
// module's too: its go.mod's require names a version the module proxy does
// not serve yet, and the replace in this module's go.mod applies only here.
//
//	replace (
//		github.com/pglease/pglease => ../pglease
//		github.com/pglease/pglease/pgleaseotel => ../pglease/pgleaseotel
//	)
//
// Drop both once the release is tagged. See docs/GUIDE.md, "Modules".
package pgleaseotel
