package pgleaseotel

import (
	"context"

	"github.com/jackc/pgx/v5"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
)

// Guard is lease.Guard(ctx, tx) in a span, pglease.guard, child of ctx's
// span; a refusal (any error: Guard then aborts tx) is counted in
// pglease.guard.refusals. A Locker reports no event for Guard, so only a
// call through this method is seen.
func (t *Telemetry) Guard(ctx context.Context, lease *pglease.Lease, tx pgx.Tx) error {
	attrs := append(append([]attribute.KeyValue{}, t.dbAttrs...),
		dbOperationName.String(opGuard),
		keyKey.String(lease.Key()), fenceKey.Int64(lease.Fence()), holderKey.String(lease.Holder()))
	ctx, span := t.tracer.Start(ctx, "pglease.guard", trace.WithSpanKind(trace.SpanKindClient), trace.WithAttributes(attrs...))
	defer span.End()
	err := lease.Guard(ctx, tx)
	if err != nil {
		t.refusals.Add(ctx, 1, metric.WithAttributes(errorTypeKey.String(errorType(err))))
		failed(span, err, outcomeFailed)
	}
	return err
}

// ClaimWait is l.ClaimWait(ctx, key) in a span, pglease.claim_wait, child
// of ctx's span, counted in pglease.claim_wait.active while it waits and
// timed by pglease.claim_wait.duration. Each attempt it makes is a claim
// that the hook reports as well, in a pglease.claim span of its own.
func (t *Telemetry) ClaimWait(ctx context.Context, l *pglease.Locker, key string) (*pglease.Lease, error) {
	return t.wait(ctx, key, l.Holder(), func(ctx context.Context) (*pglease.Lease, error) { return l.ClaimWait(ctx, key) })
}

// Campaign is e.Campaign(ctx) in a span, pglease.claim_wait, measured as
// ClaimWait is: an Elector's campaign is a waiting claim of its key. Its
// span has pglease.holder once the campaign won, as an Elector does not
// say its holder.
func (t *Telemetry) Campaign(ctx context.Context, e *pglease.Elector) (*pglease.Lease, error) {
	return t.wait(ctx, e.Key(), "", e.Campaign)
}

func (t *Telemetry) wait(ctx context.Context, key, holder string, claim func(context.Context) (*pglease.Lease, error)) (*pglease.Lease, error) {
	attrs := append(append([]attribute.KeyValue{}, t.dbAttrs...),
		dbOperationName.String(opClaimWait), keyKey.String(key))
	if holder != "" {
		attrs = append(attrs, holderKey.String(holder))
	}
	ctx, span := t.tracer.Start(ctx, "pglease.claim_wait", trace.WithSpanKind(trace.SpanKindInternal), trace.WithAttributes(attrs...))
	defer span.End()
	var keyAttr []attribute.KeyValue
	if t.perKey {
		keyAttr = []attribute.KeyValue{keyKey.String(key)}
	}
	t.waiting.Add(ctx, 1, metric.WithAttributes(keyAttr...))
	start := t.now()
	lease, err := claim(ctx)
	took := t.now().Sub(start)
	t.waiting.Add(ctx, -1, metric.WithAttributes(keyAttr...))
	if err != nil {
		t.waitTime.Record(ctx, took.Seconds(), metric.WithAttributes(append(keyAttr,
			outcomeKey.String(outcomeFailed), errorTypeKey.String(errorType(err)))...))
		span.SetAttributes(outcomeKey.String(outcomeFailed))
		failed(span, err, outcomeFailed)
		return nil, err
	}
	t.waitTime.Record(ctx, took.Seconds(), metric.WithAttributes(append(keyAttr, outcomeKey.String(outcomeAcquired))...))
	span.SetAttributes(outcomeKey.String(outcomeAcquired), fenceKey.Int64(lease.Fence()), holderKey.String(lease.Holder()))
	return lease, nil
}
