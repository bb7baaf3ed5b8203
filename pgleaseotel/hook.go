package pgleaseotel

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/leaseset"
)

// Hook records one event as metrics and, for claims, heartbeat rounds,
// releases and losses, a span. Pass it to pglease.WithHook; it is safe for
// concurrent use by several Lockers and returns quickly.
//
// A claim's or release's span is a child of the caller's span (the event's
// Context); a heartbeat round's and a loss's are roots (see the package doc).
func (t *Telemetry) Hook(e pglease.Event) {
	ctx := context.Background()
	now := t.now()
	if !e.Skew.At.IsZero() { // claims and heartbeat rounds carry a reading
		t.skew.Record(ctx, e.Skew.Offset.Seconds())
		t.skewUncertainty.Record(ctx, e.Skew.Uncertainty.Seconds())
	}
	switch e.Kind {
	case pglease.EventAcquired:
		t.claims.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeAcquired)))
		if t.leases.Acquired(leaseset.Of(e)) {
			t.held.Add(ctx, 1, t.keyed(e))
		}
		t.span(e, now, "pglease.claim", opClaim, outcomeAcquired)
		switch {
		case e.CaughtUp:
			t.ticks.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeCaughtUp)))
		case !e.Tick.IsZero():
			t.ticks.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeRan)))
		}
	case pglease.EventContended:
		t.claims.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeHeld)))
		if e.Skipped {
			t.ticks.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeSkipped)))
		}
		t.span(e, now, "pglease.claim", opClaim, outcomeHeld)
	case pglease.EventClaimFailed:
		t.claims.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeFailed), errorTypeKey.String(errorType(e.Err))))
		t.span(e, now, "pglease.claim", opClaim, outcomeFailed)
	case pglease.EventExtended:
		t.rounds.Add(ctx, 1, metric.WithAttributes(outcomeKey.String(outcomeExtended)))
		t.roundTime.Record(ctx, e.Took.Seconds(), metric.WithAttributes(outcomeKey.String(outcomeExtended)))
		t.span(e, now, "pglease.heartbeat", opHeartbeat, outcomeExtended)
	case pglease.EventHeartbeatFailed:
		failed := metric.WithAttributes(outcomeKey.String(outcomeFailed), errorTypeKey.String(errorType(e.Err)))
		t.rounds.Add(ctx, 1, failed)
		t.roundTime.Record(ctx, e.Took.Seconds(), failed)
		t.span(e, now, "pglease.heartbeat", opHeartbeat, outcomeFailed)
	case pglease.EventLost:
		t.lost.Add(ctx, 1, t.keyed(e, errorTypeKey.String(errorType(e.Err))))
		if t.leases.Ended(leaseset.Of(e)) {
			t.held.Add(ctx, -1, t.keyed(e))
		}
		t.span(e, now, "pglease.lost", "", outcomeLost)
	case pglease.EventReleased:
		t.releases.Add(ctx, 1, t.keyed(e, outcomeKey.String(outcomeReleased)))
		if t.leases.Ended(leaseset.Of(e)) {
			t.held.Add(ctx, -1, t.keyed(e))
		}
		t.span(e, now, "pglease.release", opRelease, outcomeReleased)
	case pglease.EventReleaseFailed:
		outcome := outcomeFailed
		attrs := []attribute.KeyValue{outcomeKey.String(outcome), errorTypeKey.String(errorType(e.Err))}
		if errors.Is(e.Err, pglease.ErrLost) {
			outcome = outcomeLost
			attrs = []attribute.KeyValue{outcomeKey.String(outcome)}
		}
		t.releases.Add(ctx, 1, t.keyed(e, attrs...))
		if t.leases.Ended(leaseset.Of(e)) {
			t.held.Add(ctx, -1, t.keyed(e))
		}
		t.span(e, now, "pglease.release", opRelease, outcome)
	case pglease.EventElected:
		t.elections.Add(ctx, 1)
		if gap, ok := t.vacant.elected(e.Key, e.Fence); ok {
			t.handovers.Record(ctx, gap.Seconds(), t.keyed(e))
		}
	case pglease.EventNewLeader:
		if gap, ok := t.vacant.newLeader(e.Key, e.Holder); ok {
			t.handovers.Record(ctx, gap.Seconds(), t.keyed(e))
		}
	case pglease.EventStoppedLeading:
		if gap, ok := t.vacant.stop(e.Key, e.Holder, e.Fence); ok {
			t.handovers.Record(ctx, gap.Seconds(), t.keyed(e))
		}
	}
}

// keyed is a metric's attributes: attrs, then pglease.key when PerKey is
// set.
func (t *Telemetry) keyed(e pglease.Event, attrs ...attribute.KeyValue) metric.MeasurementOption {
	if t.perKey {
		attrs = append(attrs, keyKey.String(e.Key))
	}
	return metric.WithAttributes(attrs...)
}

// span records the span of e after the fact: it began Took before now (the
// round trip of its claim, round or release; zero for a loss) and ends at
// now, as a child of the span in e.Context, the caller's, when there is
// one. op is its db.operation.name, none for a loss, which no statement of
// its own reports.
func (t *Telemetry) span(e pglease.Event, now time.Time, name, op, outcome string) {
	kind := trace.SpanKindClient
	if op == "" {
		kind = trace.SpanKindInternal
	}
	attrs := t.leaseAttrs(e)
	if op != "" {
		attrs = append(attrs, dbOperationName.String(op))
	}
	attrs = append(attrs, outcomeKey.String(outcome))
	parent := e.Context
	if parent == nil {
		parent = context.Background()
	}
	_, span := t.tracer.Start(parent, name,
		trace.WithSpanKind(kind),
		trace.WithTimestamp(now.Add(-e.Took)),
		trace.WithAttributes(attrs...))
	failed(span, e.Err, outcome)
	span.End(trace.WithTimestamp(now))
}

// leaseAttrs are the attributes of a span about e's lease (or round).
func (t *Telemetry) leaseAttrs(e pglease.Event) []attribute.KeyValue {
	attrs := append([]attribute.KeyValue{}, t.dbAttrs...)
	attrs = append(attrs, holderKey.String(e.Holder))
	if e.Key != "" {
		attrs = append(attrs, keyKey.String(e.Key))
	}
	if e.Fence != 0 {
		attrs = append(attrs, fenceKey.Int64(e.Fence))
	}
	if e.Kind == pglease.EventExtended || e.Kind == pglease.EventHeartbeatFailed {
		attrs = append(attrs, leasesKey.Int(e.Leases))
	}
	return attrs
}

// failed marks span as failed with err, unless outcome says err is the
// normal outcome of contention (held).
func failed(span trace.Span, err error, outcome string) {
	if err == nil || outcome == outcomeHeld {
		return
	}
	span.SetAttributes(errorTypeKey.String(errorType(err)))
	span.SetStatus(codes.Error, err.Error())
}
