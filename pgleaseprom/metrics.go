package pgleaseprom

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/leaseset"
)

// DefaultNamespace prefixes every metric name when Opts.Namespace is empty.
const DefaultNamespace = "pglease"

// DefaultHeartbeatBuckets are the upper bounds, in seconds, of the heartbeat
// latency histogram when Opts.HeartbeatBuckets is empty: 1 ms doubling up
// to about 8 s. A heartbeat is one UPDATE, so most heartbeats fall in the
// first few buckets; the long tail shows a database that is struggling.
var DefaultHeartbeatBuckets = prometheus.ExponentialBuckets(0.001, 2, 14)

// Label values of the outcome label.
const (
	outcomeAcquired = "acquired"  // claims: a lease was issued
	outcomeHeld     = "held"      // claims: another holder's lease is live (ErrHeld)
	outcomeFailed   = "failed"    // claims and releases: any other failure, as the Event kinds claim_failed and release_failed say
	outcomeReleased = "released"  // releases: the row was expired in place
	outcomeLost     = "lost"      // releases: a later lease owned the key (ErrLost)
	outcomeRan      = "ran"       // ticks: this replica claimed the tick to run it
	outcomeCaughtUp = "caught_up" // ticks: this replica runs a tick whose run lapsed
	outcomeSkipped  = "skipped"   // ticks: the run of an earlier tick still held the key
)

// Opts configures New. The zero value is ready to use.
type Opts struct {
	// Namespace prefixes every metric name. The default is DefaultNamespace.
	Namespace string
	// Subsystem goes between the namespace and the name. The default is
	// none.
	Subsystem string
	// ConstLabels are added to every metric, for instance to tell two
	// Metrics apart in one registry.
	ConstLabels prometheus.Labels
	// PerKey adds a "key" label (the job name) to the claim, held, lost and
	// release metrics. Off by default: every key is a new series.
	PerKey bool
	// HeartbeatBuckets are the heartbeat latency histogram's upper bounds,
	// in seconds. The default is DefaultHeartbeatBuckets.
	HeartbeatBuckets []float64
}

// Metrics is a prometheus.Collector fed by the events of one or more
// Lockers through Hook. Register it once, then pass Hook to WithHook.
type Metrics struct {
	perKey            bool
	claims            *prometheus.CounterVec
	held              *prometheus.GaugeVec
	lost              *prometheus.CounterVec
	heartbeat         prometheus.Histogram
	heartbeatFailures prometheus.Counter
	releases          *prometheus.CounterVec
	ticks             *prometheus.CounterVec
	elections         prometheus.Counter
	skew              prometheus.Gauge
	skewUncertainty   prometheus.Gauge
	leases            leaseset.Set
}

var _ prometheus.Collector = (*Metrics)(nil)

// New returns Metrics configured by opts. It registers nothing: pass it to
// a registry's Register or MustRegister.
func New(opts Opts) *Metrics {
	ns := opts.Namespace
	if ns == "" {
		ns = DefaultNamespace
	}
	buckets := opts.HeartbeatBuckets
	if len(buckets) == 0 {
		buckets = DefaultHeartbeatBuckets
	}
	var keyLabel []string
	if opts.PerKey {
		keyLabel = []string{"key"}
	}
	withOutcome := append([]string{"outcome"}, keyLabel...)
	// The names follow Prometheus' conventions: the tests lint them.
	named := func(n, help string) prometheus.Opts {
		return prometheus.Opts{Namespace: ns, Subsystem: opts.Subsystem, Name: n, Help: help, ConstLabels: opts.ConstLabels}
	}
	counter := func(n, help string, labels []string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts(named(n, help)), labels)
	}
	gauge := func(n, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts(named(n, help)))
	}

	m := &Metrics{
		perKey: opts.PerKey,
		claims: counter("claims_total",
			"Claims of a lease, by outcome: acquired, held (another holder's lease is live) or failed.", withOutcome),
		lost: counter("leases_lost_total",
			"Leases that ended without being released: taken by a later lease, lapsed, or past their trust deadline.", keyLabel),
		releases: counter("releases_total",
			"Releases (Unlock or Close), by outcome: released, lost (a later lease owned the key) or failed.", withOutcome),
		ticks: counter("ticks_total",
			"Ticks of jobs with ticks (WithPeriod) this replica claimed, by outcome: ran, caught_up (ran a tick whose run lapsed on another replica) or skipped (the run of an earlier tick still held the key).", withOutcome),
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts(named("leases_held",
			"Leases held now: acquired and not yet released or lost.")), keyLabel),
		heartbeat: prometheus.NewHistogram(prometheus.HistogramOpts{
			Namespace: ns, Subsystem: opts.Subsystem, Name: "heartbeat_duration_seconds", ConstLabels: opts.ConstLabels,
			Help:    "Round trip of each successful heartbeat, which extends all the leases of a Locker in one statement.",
			Buckets: buckets,
		}),
		heartbeatFailures: prometheus.NewCounter(prometheus.CounterOpts(named("heartbeat_failures_total",
			"Heartbeat rounds that failed; they are retried until each lease's trust deadline."))),
		elections: prometheus.NewCounter(prometheus.CounterOpts(named("elections_total",
			"Times an Elector of this process became the leader."))),
		skew: gauge("clock_skew_seconds",
			"The database's clock minus this replica's wall clock, as read by the latest claim (positive: the database is ahead)."),
		skewUncertainty: gauge("clock_skew_uncertainty_seconds",
			"The bound on the error of pglease_clock_skew_seconds (half the round trip of its sample): the skew is certain beyond it."),
	}
	if !opts.PerKey {
		// Every series exists from the start, at zero, so that rate() and
		// alerts see the first failure.
		for _, o := range []string{outcomeAcquired, outcomeHeld, outcomeFailed} {
			m.claims.WithLabelValues(o)
		}
		for _, o := range []string{outcomeReleased, outcomeLost, outcomeFailed} {
			m.releases.WithLabelValues(o)
		}
		for _, o := range []string{outcomeRan, outcomeCaughtUp, outcomeSkipped} {
			m.ticks.WithLabelValues(o)
		}
		m.lost.WithLabelValues()
		m.held.WithLabelValues()
	}
	return m
}

// Describe implements prometheus.Collector.
func (m *Metrics) Describe(ch chan<- *prometheus.Desc) {
	for _, c := range m.collectors() {
		c.Describe(ch)
	}
}

// Collect implements prometheus.Collector.
func (m *Metrics) Collect(ch chan<- prometheus.Metric) {
	for _, c := range m.collectors() {
		c.Collect(ch)
	}
}

func (m *Metrics) collectors() []prometheus.Collector {
	return []prometheus.Collector{m.claims, m.held, m.lost, m.heartbeat, m.heartbeatFailures, m.releases, m.ticks, m.elections, m.skew, m.skewUncertainty}
}

// Hook records one event. Pass it to pglease.WithHook; it is safe for
// concurrent use by several Lockers and returns quickly.
func (m *Metrics) Hook(e pglease.Event) {
	if !e.Skew.At.IsZero() { // claims and heartbeat rounds carry a reading
		m.skew.Set(e.Skew.Offset.Seconds())
		m.skewUncertainty.Set(e.Skew.Uncertainty.Seconds())
	}
	switch e.Kind {
	case pglease.EventAcquired:
		m.claims.WithLabelValues(m.labels(e, outcomeAcquired)...).Inc()
		switch {
		case e.CaughtUp:
			m.ticks.WithLabelValues(m.labels(e, outcomeCaughtUp)...).Inc()
		case !e.Tick.IsZero():
			m.ticks.WithLabelValues(m.labels(e, outcomeRan)...).Inc()
		}
		if m.leases.Acquired(leaseset.Of(e)) {
			m.held.WithLabelValues(m.labels(e)...).Inc()
		}
	case pglease.EventContended:
		m.claims.WithLabelValues(m.labels(e, outcomeHeld)...).Inc()
		if e.Skipped {
			m.ticks.WithLabelValues(m.labels(e, outcomeSkipped)...).Inc()
		}
	case pglease.EventClaimFailed:
		m.claims.WithLabelValues(m.labels(e, outcomeFailed)...).Inc()
	case pglease.EventExtended:
		m.heartbeat.Observe(e.Took.Seconds())
	case pglease.EventHeartbeatFailed:
		m.heartbeatFailures.Inc()
	case pglease.EventElected:
		m.elections.Inc()
	case pglease.EventLost:
		m.lost.WithLabelValues(m.labels(e)...).Inc()
		if m.leases.Ended(leaseset.Of(e)) {
			m.held.WithLabelValues(m.labels(e)...).Dec()
		}
	case pglease.EventReleased:
		m.releases.WithLabelValues(m.labels(e, outcomeReleased)...).Inc()
		if m.leases.Ended(leaseset.Of(e)) {
			m.held.WithLabelValues(m.labels(e)...).Dec()
		}
	case pglease.EventReleaseFailed:
		outcome := outcomeFailed
		if errors.Is(e.Err, pglease.ErrLost) {
			outcome = outcomeLost
		}
		m.releases.WithLabelValues(m.labels(e, outcome)...).Inc()
		if m.leases.Ended(leaseset.Of(e)) {
			m.held.WithLabelValues(m.labels(e)...).Dec()
		}
	}
}

// labels are the label values of a series: the given ones, then the key
// when PerKey is set.
func (m *Metrics) labels(e pglease.Event, values ...string) []string {
	if m.perKey {
		return append(values, e.Key)
	}
	return values
}
