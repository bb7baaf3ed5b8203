package pgleaseotel_test

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseotel"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// telemetry is a Telemetry on SDK providers whose metrics a test reads
// back through reader and whose ended spans through spans.
type telemetry struct {
	*pgleaseotel.Telemetry
	reader *sdkmetric.ManualReader
	spans  *tracetest.SpanRecorder
	tp     *sdktrace.TracerProvider // for the spans of a caller
}

func newTelemetry(t *testing.T, opts pgleaseotel.Opts) *telemetry {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	t.Cleanup(func() {
		_ = mp.Shutdown(context.Background())
		_ = tp.Shutdown(context.Background())
	})
	opts.MeterProvider, opts.TracerProvider = mp, tp
	tel, err := pgleaseotel.New(opts)
	require.NoError(t, err)
	return &telemetry{Telemetry: tel, reader: reader, spans: spans, tp: tp}
}

// metric is the instrument name as last collected; ok is false if the
// reader has no data for it.
func (tt *telemetry) metric(t *testing.T, name string) (metricdata.Metrics, bool) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := tt.reader.Collect(context.Background(), &rm); err != nil {
		t.Errorf("collect: %v", err)
		return metricdata.Metrics{}, false
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if m.Name == name {
				return m, true
			}
		}
	}
	return metricdata.Metrics{}, false
}

// sum reads back the value of the counter or up-down counter name whose
// attributes are exactly attrs; the test fails if there is no such series.
func (tt *telemetry) sum(t *testing.T, name string, attrs ...attribute.KeyValue) int64 {
	t.Helper()
	v, ok := tt.lookup(name, attrs...)
	require.True(t, ok, "a series %s%v is collected", name, attrs)
	return v
}

// lookup is sum without failing: ok is false when there is no such
// series (yet). Safe in a condition of require.Eventually.
func (tt *telemetry) lookup(name string, attrs ...attribute.KeyValue) (int64, bool) {
	var rm metricdata.ResourceMetrics
	if err := tt.reader.Collect(context.Background(), &rm); err != nil {
		return 0, false
	}
	want := attribute.NewSet(attrs...)
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			data, ok := m.Data.(metricdata.Sum[int64])
			if m.Name != name || !ok {
				continue
			}
			for _, p := range data.DataPoints {
				if p.Attributes.Equals(&want) {
					return p.Value, true
				}
			}
		}
	}
	return 0, false
}

// histogram reads back the series of the histogram name whose attributes
// are exactly attrs.
func (tt *telemetry) histogram(t *testing.T, name string, attrs ...attribute.KeyValue) metricdata.HistogramDataPoint[float64] {
	t.Helper()
	m, ok := tt.metric(t, name)
	require.True(t, ok, "%s is collected", name)
	data, ok := m.Data.(metricdata.Histogram[float64])
	require.True(t, ok, "%s is a float64 histogram, not %T", name, m.Data)
	want := attribute.NewSet(attrs...)
	for _, p := range data.DataPoints {
		if p.Attributes.Equals(&want) {
			return p
		}
	}
	t.Fatalf("no series %s%v", name, attrs)
	return metricdata.HistogramDataPoint[float64]{}
}

// gauge reads back the only series of the gauge name.
func (tt *telemetry) gauge(t *testing.T, name string) float64 {
	t.Helper()
	m, ok := tt.metric(t, name)
	require.True(t, ok, "%s is collected", name)
	data, ok := m.Data.(metricdata.Gauge[float64])
	require.True(t, ok, "%s is a float64 gauge, not %T", name, m.Data)
	require.Len(t, data.DataPoints, 1)
	return data.DataPoints[0].Value
}

// ended are the spans named name that have ended, in the order they ended.
func (tt *telemetry) ended(name string) []sdktrace.ReadOnlySpan {
	var out []sdktrace.ReadOnlySpan
	for _, s := range tt.spans.Ended() {
		if s.Name() == name {
			out = append(out, s)
		}
	}
	return out
}

// attrs are a span's attributes by key.
func attrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	out := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		out[kv.Key] = kv.Value
	}
	return out
}

// outcome is the pglease.outcome attribute.
func outcome(o string) attribute.KeyValue { return attribute.String("pglease.outcome", o) }

// errorType is the error.type attribute.
func errorType(v string) attribute.KeyValue { return attribute.String("error.type", v) }
