package pgleaseotel

import (
	"context"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease/internal/leaseset"
)

// ScopeName is the instrumentation scope of the meter and tracer that New
// takes from its providers: the import path of this package.
const ScopeName = "github.com/pglease/pglease/pgleaseotel"

// DefaultHeartbeatBuckets are the bucket boundaries, in seconds, of the
// pglease.heartbeat.duration histogram when Opts.HeartbeatBuckets is empty:
// 1 ms doubling up to about 8 s. A heartbeat round is one UPDATE, so most
// rounds fall in the first few buckets; the long tail shows a database that
// is struggling.
var DefaultHeartbeatBuckets = []float64{
	0.001, 0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.512, 1.024, 2.048, 4.096, 8.192,
}

// DefaultWaitBuckets are the bucket boundaries, in seconds, of the
// pglease.claim_wait.duration and pglease.elector.handover.duration
// histograms when Opts.WaitBuckets is empty: from 10 ms to 10 minutes, as a
// wait lasts up to the TTL of the lease it waits for.
var DefaultWaitBuckets = []float64{0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600}

// Opts configures New. The zero value is ready to use.
type Opts struct {
	// MeterProvider gives the meter of every metric. The default is
	// otel.GetMeterProvider(), the global one.
	MeterProvider metric.MeterProvider
	// TracerProvider gives the tracer of every span. The default is
	// otel.GetTracerProvider(), the global one.
	TracerProvider trace.TracerProvider
	// Table is the lease table, set as db.collection.name on every span.
	// Set it when every Locker fed by this Telemetry uses one table
	// ("lease" by default, or the name given to pglease.WithTable); the
	// default is none, as an Event does not say its table.
	Table string
	// PerKey adds the pglease.key attribute (the job name) to the claim,
	// leases held, loss, release and handover metrics. Off by default:
	// every key is a new series. Spans always carry it.
	PerKey bool
	// HeartbeatBuckets are the bucket boundaries, in seconds, of the
	// heartbeat round histogram. The default is DefaultHeartbeatBuckets.
	HeartbeatBuckets []float64
	// WaitBuckets are the bucket boundaries, in seconds, of the waiting
	// claim and handover histograms. The default is DefaultWaitBuckets.
	WaitBuckets []float64
}

// Telemetry turns what one or more Lockers report into OpenTelemetry
// metrics and spans. Pass its Hook to pglease.WithHook; wrap Guard,
// ClaimWait and Campaign calls with its methods of the same names, which
// the hook cannot see. It is safe for concurrent use.
type Telemetry struct {
	tracer  trace.Tracer
	perKey  bool
	dbAttrs []attribute.KeyValue // db.system.name, and db.collection.name if set
	now     func() time.Time

	claims          metric.Int64Counter
	held            metric.Int64UpDownCounter
	rounds          metric.Int64Counter
	roundTime       metric.Float64Histogram
	lost            metric.Int64Counter
	releases        metric.Int64Counter
	ticks           metric.Int64Counter
	refusals        metric.Int64Counter
	waitTime        metric.Float64Histogram
	waiting         metric.Int64UpDownCounter
	elections       metric.Int64Counter
	handovers       metric.Float64Histogram
	skew            metric.Float64Gauge
	skewUncertainty metric.Float64Gauge
	jobRuns         metric.Int64Counter
	jobTime         metric.Float64Histogram

	leases leaseset.Set
	vacant vacancies
}

// New returns a Telemetry whose instruments come from opts' providers. It
// fails only if a provider refuses an instrument.
func New(opts Opts) (*Telemetry, error) {
	mp := opts.MeterProvider
	if mp == nil {
		mp = otel.GetMeterProvider()
	}
	tp := opts.TracerProvider
	if tp == nil {
		tp = otel.GetTracerProvider()
	}
	hb := opts.HeartbeatBuckets
	if len(hb) == 0 {
		hb = DefaultHeartbeatBuckets
	}
	wb := opts.WaitBuckets
	if len(wb) == 0 {
		wb = DefaultWaitBuckets
	}
	t := &Telemetry{
		tracer:  tp.Tracer(ScopeName),
		perKey:  opts.PerKey,
		dbAttrs: []attribute.KeyValue{dbSystemPostgreSQL},
		now:     time.Now,
	}
	t.vacant.now = t.now
	if opts.Table != "" {
		t.dbAttrs = append(t.dbAttrs, dbCollectionName.String(opts.Table))
	}
	m := mp.Meter(ScopeName)
	var errs []error
	counter := func(name, unit, desc string) metric.Int64Counter {
		c, err := m.Int64Counter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	upDown := func(name, unit, desc string) metric.Int64UpDownCounter {
		c, err := m.Int64UpDownCounter(name, metric.WithUnit(unit), metric.WithDescription(desc))
		errs = append(errs, err)
		return c
	}
	histogram := func(name, desc string, buckets []float64) metric.Float64Histogram {
		h, err := m.Float64Histogram(name, metric.WithUnit("s"), metric.WithDescription(desc),
			metric.WithExplicitBucketBoundaries(buckets...))
		errs = append(errs, err)
		return h
	}
	gauge := func(name, desc string) metric.Float64Gauge {
		g, err := m.Float64Gauge(name, metric.WithUnit("s"), metric.WithDescription(desc))
		errs = append(errs, err)
		return g
	}
	t.claims = counter("pglease.claims", "{claim}",
		"Claims of a lease, by pglease.outcome: acquired, held (another holder's lease is live) or failed.")
	t.held = upDown("pglease.leases.held", "{lease}",
		"Leases held now: acquired and not yet released or lost.")
	t.rounds = counter("pglease.heartbeat.rounds", "{round}",
		"Heartbeat rounds, by pglease.outcome: extended, or failed (retried until each lease's trust deadline).")
	t.roundTime = histogram("pglease.heartbeat.duration",
		"Round trip of each heartbeat, which extends all the leases of a Locker in one statement.", hb)
	t.lost = counter("pglease.leases.lost", "{lease}",
		"Leases that ended without being released, by error.type: revoked by an operator, or lost (taken by a later lease, lapsed, past their trust deadline).")
	t.releases = counter("pglease.releases", "{release}",
		"Releases (Unlock or Close), by pglease.outcome: released, lost (a later lease owned the key) or failed.")
	t.ticks = counter("pglease.ticks", "{tick}",
		"Ticks of jobs with ticks (WithPeriod) this replica claimed, by pglease.outcome: ran, caught_up (ran a tick whose run lapsed on another replica) or skipped (the run of an earlier tick still held the key).")
	t.refusals = counter("pglease.guard.refusals", "{refusal}",
		"Guarded transactions that Guard aborted, by error.type: lost (the lease was no longer current) or the SQLSTATE of the failure.")
	t.waitTime = histogram("pglease.claim_wait.duration",
		"Time from the start of a waiting claim (ClaimWait, Campaign) to its lease or its failure, by pglease.outcome.", wb)
	t.waiting = upDown("pglease.claim_wait.active", "{claim}",
		"Waiting claims (ClaimWait, Campaign) in progress.")
	t.elections = counter("pglease.elector.elections", "{election}",
		"Times an Elector fed into this Telemetry became the leader.")
	t.handovers = histogram("pglease.elector.handover.duration",
		"Time from the end of an Elector's leadership to the next leader of its key that this Telemetry saw.", wb)
	t.skew = gauge("pglease.clock.skew",
		"The database's clock minus this replica's wall clock, as read by the latest claim or heartbeat (positive: the database is ahead).")
	t.skewUncertainty = gauge("pglease.clock.skew.uncertainty",
		"The bound on the error of pglease.clock.skew (half the round trip of its sample): the skew is certain beyond it.")
	t.jobRuns = counter("pglease.job.runs", "{run}",
		"Runs of gocron jobs, by pglease.job.status: success, fail, or skip (the distributed locker's Lock failed: another replica held the key), as JobMonitor reports them.")
	jt, err := m.Float64Histogram("pglease.job.duration", metric.WithUnit("s"),
		metric.WithDescription("Time each gocron job run took, as JobMonitor reports it."))
	t.jobTime = jt
	errs = append(errs, err)
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("pgleaseotel: new: %w", err)
	}
	if !opts.PerKey {
		// Every series exists from the start, at zero, so that rates and
		// alerts see the first failure.
		ctx := context.Background()
		for _, o := range []string{outcomeAcquired, outcomeHeld, outcomeFailed} {
			t.claims.Add(ctx, 0, metric.WithAttributes(outcomeKey.String(o)))
		}
		for _, o := range []string{outcomeReleased, outcomeLost, outcomeFailed} {
			t.releases.Add(ctx, 0, metric.WithAttributes(outcomeKey.String(o)))
		}
		for _, o := range []string{outcomeRan, outcomeCaughtUp, outcomeSkipped} {
			t.ticks.Add(ctx, 0, metric.WithAttributes(outcomeKey.String(o)))
		}
		t.held.Add(ctx, 0)
	}
	return t, nil
}
