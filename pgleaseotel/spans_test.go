package pgleaseotel_test

import (
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/trace"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseotel"
)

// events records what a Locker reports, beside a Telemetry's hook.
type events struct {
	mu  sync.Mutex
	all []pglease.Event
}

func (ev *events) hook(e pglease.Event) {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	ev.all = append(ev.all, e)
}

// of is the events of kind, in the order they were reported.
func (ev *events) of(kind pglease.EventKind) []pglease.Event {
	ev.mu.Lock()
	defer ev.mu.Unlock()
	var out []pglease.Event
	for _, e := range ev.all {
		if e.Kind == kind {
			out = append(out, e)
		}
	}
	return out
}

// only is the one span named name; the test fails unless there is exactly
// one.
func (tt *telemetry) only(t *testing.T, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	spans := tt.ended(name)
	require.Len(t, spans, 1, "spans named %s", name)
	return spans[0]
}

// wantAttrs checks that span has every attribute of want.
func wantAttrs(t *testing.T, span sdktrace.ReadOnlySpan, want ...attribute.KeyValue) {
	t.Helper()
	got := attrs(span)
	for _, kv := range want {
		v, ok := got[kv.Key]
		if assert.True(t, ok, "%s has %s", span.Name(), kv.Key) {
			assert.Equal(t, kv.Value.String(), v.String(), "%s's %s", span.Name(), kv.Key)
		}
	}
}

func TestSpans(t *testing.T) {
	t.Parallel()
	db := func(table, op string) []attribute.KeyValue {
		return []attribute.KeyValue{
			attribute.String("db.system.name", "postgresql"),
			attribute.String("db.collection.name", table),
			attribute.String("db.operation.name", op),
		}
	}

	t.Run("Claim", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		var ev events
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook), pglease.WithHook(ev.hook))
		jctx, job := tel.tp.Tracer("job").Start(ctx, "job run")
		lease, err := l.Claim(jctx, "job")
		require.NoError(t, err)

		span := tel.only(t, "pglease.claim")
		assert.Equal(t, trace.SpanKindClient, span.SpanKind())
		assert.Equal(t, job.SpanContext().SpanID(), span.Parent().SpanID(), "the claim's span is a child of its caller's")
		assert.Equal(t, job.SpanContext().TraceID(), span.SpanContext().TraceID())
		job.End()
		assert.Equal(t, codes.Unset, span.Status().Code)
		wantAttrs(t, span, db(table, "claim")...)
		wantAttrs(t, span, attribute.String("pglease.key", "job"), attribute.Int64("pglease.fence", lease.Fence()),
			attribute.String("pglease.holder", l.Holder()), attribute.String("pglease.outcome", "acquired"))
		assert.NotContains(t, attrs(span), attribute.Key("error.type"))
		acquired := ev.of(pglease.EventAcquired)
		require.Len(t, acquired, 1)
		assert.Positive(t, acquired[0].Took)
		assert.Equal(t, acquired[0].Took, span.EndTime().Sub(span.StartTime()), "the span lasts the claim's round trip")
	})

	t.Run("Contended", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		a := pgtest.Locker(t, pool, table, "a")
		b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(tel.Hook))
		_, err := a.Claim(ctx, "job")
		require.NoError(t, err)
		_, err = b.Claim(ctx, "job")
		require.ErrorIs(t, err, pglease.ErrHeld)

		span := tel.only(t, "pglease.claim")
		assert.Equal(t, codes.Unset, span.Status().Code, "contention is not a failure")
		wantAttrs(t, span, attribute.String("pglease.outcome", "held"), attribute.String("pglease.holder", b.Holder()))
		assert.NotContains(t, attrs(span), attribute.Key("error.type"))
	})

	t.Run("ClaimFailed", func(t *testing.T) {
		t.Parallel()
		ctx, pool, _ := pgtest.Setup(t)
		missing := pgtest.TableName()
		tel := newTelemetry(t, pgleaseotel.Opts{Table: missing})
		l := pgtest.Locker(t, pool, missing, "a", pglease.WithHook(tel.Hook))
		_, err := l.Claim(ctx, "job")
		require.Error(t, err)

		span := tel.only(t, "pglease.claim")
		assert.Equal(t, codes.Error, span.Status().Code)
		wantAttrs(t, span, attribute.String("pglease.outcome", "failed"), attribute.String("error.type", "42P01"))
	})

	t.Run("ReleaseAndHeartbeat", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		var ev events
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook), pglease.WithHook(ev.hook),
			pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(50*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		require.Eventually(t, func() bool { return len(tel.ended("pglease.heartbeat")) > 0 },
			10*time.Second, 10*time.Millisecond, "a heartbeat round is traced")
		round := tel.ended("pglease.heartbeat")[0]
		assert.Equal(t, trace.SpanKindClient, round.SpanKind())
		wantAttrs(t, round, db(table, "heartbeat")...)
		wantAttrs(t, round, attribute.Int("pglease.leases", 1), attribute.String("pglease.outcome", "extended"))
		assert.NotContains(t, attrs(round), attribute.Key("pglease.key"), "a round covers all the Locker's leases")
		assert.Equal(t, ev.of(pglease.EventExtended)[0].Took, round.EndTime().Sub(round.StartTime()))

		uctx, job := tel.tp.Tracer("job").Start(ctx, "job run")
		require.NoError(t, lease.Unlock(uctx))
		job.End()
		span := tel.only(t, "pglease.release")
		assert.Equal(t, job.SpanContext().SpanID(), span.Parent().SpanID(), "the release's span is a child of its caller's")
		assert.False(t, round.Parent().IsValid(), "a heartbeat round belongs to no caller: its span is a root")
		released := ev.of(pglease.EventReleased)
		require.Len(t, released, 1)
		assert.Positive(t, released[0].Took)
		assert.Equal(t, released[0].Took, span.EndTime().Sub(span.StartTime()))
		wantAttrs(t, span, db(table, "release")...)
		wantAttrs(t, span, attribute.String("pglease.key", "job"), attribute.Int64("pglease.fence", lease.Fence()),
			attribute.String("pglease.outcome", "released"))
		assert.Equal(t, codes.Unset, span.Status().Code)
	})

	t.Run("Loss", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook),
			pglease.WithTTL(3*time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		_, err = admin.Revoke(ctx, "job")
		require.NoError(t, err)
		lapse(t, lease)

		lost := tel.only(t, "pglease.lost")
		assert.Equal(t, trace.SpanKindInternal, lost.SpanKind())
		assert.Equal(t, codes.Error, lost.Status().Code)
		wantAttrs(t, lost, attribute.String("error.type", "revoked"), attribute.String("pglease.key", "job"),
			attribute.Int64("pglease.fence", lease.Fence()))
		assert.NotContains(t, attrs(lost), attribute.Key("db.operation.name"), "no statement of its own")

		require.ErrorIs(t, lease.Unlock(ctx), pglease.ErrRevoked)
		release := tel.only(t, "pglease.release")
		assert.Equal(t, codes.Error, release.Status().Code)
		wantAttrs(t, release, attribute.String("pglease.outcome", "lost"), attribute.String("error.type", "revoked"))
	})

	t.Run("Guard", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		lease, err := l.Claim(ctx, "job")
		require.NoError(t, err)

		parentCtx, parent := tel.tp.Tracer("test").Start(ctx, "job run")
		defer parent.End()
		tx, err := pool.Begin(ctx)
		require.NoError(t, err)
		require.NoError(t, tel.Guard(parentCtx, lease, tx))
		require.NoError(t, tx.Commit(ctx))
		guard := tel.only(t, "pglease.guard")
		assert.Equal(t, parent.SpanContext().SpanID(), guard.Parent().SpanID(), "the caller's span is its parent")
		assert.Equal(t, codes.Unset, guard.Status().Code)
		wantAttrs(t, guard, db(table, "guard")...)
		wantAttrs(t, guard, attribute.String("pglease.key", "job"), attribute.Int64("pglease.fence", lease.Fence()))

		require.NoError(t, lease.Unlock(ctx))
		tx, err = pool.Begin(ctx)
		require.NoError(t, err)
		require.ErrorIs(t, tel.Guard(ctx, lease, tx), pglease.ErrLost)
		_ = tx.Rollback(ctx)
		refused := tel.ended("pglease.guard")
		require.Len(t, refused, 2)
		assert.Equal(t, codes.Error, refused[1].Status().Code)
		wantAttrs(t, refused[1], attribute.String("error.type", "lost"))
	})

	t.Run("ClaimWait", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{Table: table})
		a := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))
		b := pgtest.Locker(t, pool, table, "b", pglease.WithHook(tel.Hook))
		first, err := a.Claim(ctx, "job")
		require.NoError(t, err)

		parentCtx, parent := tel.tp.Tracer("test").Start(ctx, "job run")
		got := make(chan *pglease.Lease, 1)
		go func() {
			lease, err := tel.ClaimWait(parentCtx, b, "job")
			assert.NoError(t, err)
			got <- lease
		}()
		require.Eventually(t, func() bool {
			for _, s := range tel.ended("pglease.claim") {
				if attrs(s)["pglease.holder"].AsString() == b.Holder() {
					return true
				}
			}
			return false
		}, 10*time.Second, 5*time.Millisecond, "the waiting claim's first attempt found the key held")
		require.NoError(t, first.Unlock(ctx))
		var second *pglease.Lease
		select {
		case second = <-got:
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting claim did not get the released key")
		}
		parent.End()
		require.NotNil(t, second)

		wait := tel.only(t, "pglease.claim_wait")
		assert.Equal(t, parent.SpanContext().SpanID(), wait.Parent().SpanID(), "the caller's span is its parent")
		assert.Equal(t, trace.SpanKindInternal, wait.SpanKind())
		wantAttrs(t, wait, db(table, "claim_wait")...)
		wantAttrs(t, wait, attribute.String("pglease.key", "job"), attribute.String("pglease.holder", b.Holder()),
			attribute.Int64("pglease.fence", second.Fence()), attribute.String("pglease.outcome", "acquired"))
		var outcomes []string
		for _, s := range tel.ended("pglease.claim") {
			if attrs(s)["pglease.holder"].AsString() == b.Holder() {
				outcomes = append(outcomes, attrs(s)["pglease.outcome"].AsString())
			}
		}
		assert.Equal(t, "held", outcomes[0], "its attempts are claims of their own")
		assert.Equal(t, "acquired", outcomes[len(outcomes)-1])
	})
}
