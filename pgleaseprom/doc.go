// Package pgleaseprom exports what a pglease Locker does as Prometheus
// metrics: claims by outcome, leases held, leases lost, heartbeat
// latency and failures, and releases by outcome.
//
// It plugs into the Locker's hook, so the core package keeps no metrics
// dependency:
//
//	m := pgleaseprom.New(pgleaseprom.Opts{})
//	prometheus.MustRegister(m)
//	locker := pglease.NewLocker(pool, pglease.WithHook(m.Hook))
//
// One Metrics may serve several Lockers (of one process, or on several
// tables): their counts add up.
//
// # Why Prometheus
//
// Most services that schedule jobs with gocron are scraped by Prometheus,
// and github.com/prometheus/client_golang is the library they already link;
// an OpenTelemetry meter provider can also read Prometheus collectors
// through its bridge, while the reverse needs an SDK and an exporter. The
// client's testutil package also lets tests read a metric back exactly.
//
// # Metrics
//
// With the default namespace "pglease":
//
//	pglease_claims_total{outcome}            acquired | held (another holder's live lease) | failed
//	pglease_leases_held                      leases held now
//	pglease_leases_lost_total                leases that ended without being released
//	pglease_heartbeat_duration_seconds       round trip of each successful heartbeat
//	pglease_heartbeat_failures_total         failed heartbeats (retried while the lease is trusted)
//	pglease_releases_total{outcome}          released | lost (a later lease owned the key) | failed
//	pglease_clock_skew_seconds               database clock minus this replica's wall clock, by the latest claim or heartbeat
//	pglease_clock_skew_uncertainty_seconds   the bound on its error (half the round trip of its sample)
//
// Both skew gauges are 0 until the first claim. Alert on
// abs(pglease_clock_skew_seconds) - pglease_clock_skew_uncertainty_seconds
// above half your min hold: see pglease.Locker.ClockSkew.
//
// A rising pglease_claims_total{outcome="failed"} is the alert to have: a
// claim that fails skips the job, and gocron logs nothing about it.
//
// # Keys as labels
//
// By default no metric carries the lease key: keys are job names, and a
// label per key multiplies every series by the number of jobs. Opts.PerKey
// adds a "key" label to the claim, held, lost and release metrics (not to
// the heartbeat ones, which cover all the leases of a Locker in one statement).
// Use it only with a small, fixed set of job names.
//
// # Module
//
// pgleaseprom is a module of its own, so that importing pglease brings no
// Prometheus dependency:
//
//	go get github.com/pglease/pglease/pgleaseprom
//
// Each release tags it with the root module's version (pgleaseprom/v0.5.0
// beside v0.5.0), and its go.mod requires the root module at that version
// (it shares the root's internal/leaseset, new in v0.5.0).
// The replace directive in its go.mod points the root module at this
// repository's code for the checks and tests that build each module alone
// (GOWORK=off): the go command applies a replace only in the module it is
// run in, so the directive never reaches a module that imports pgleaseprom,
// which gets the required release.
//
// Before that release is tagged, a module that uses this repository's
// code (a checkout at ../pglease) needs two replace lines, the root
// module's too: its go.mod's require names a version the module proxy does
// not serve yet, and the replace in this module's go.mod applies only here.
//
//	replace (
//		github.com/pglease/pglease => ../pglease
//		github.com/pglease/pglease/pgleaseprom => ../pglease/pgleaseprom
//	)
//
// Drop both once the release is tagged. See docs/GUIDE.md, "Modules".
package pgleaseprom
