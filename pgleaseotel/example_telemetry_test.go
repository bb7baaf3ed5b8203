package pgleaseotel_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"go.opentelemetry.io/otel/attribute"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseotel"
)

// databaseURL stands for your service's connection string.
func databaseURL() string { return pgtest.Server.DSN() }

// Report what a Locker does through the service's OpenTelemetry providers:
// here an SDK with a manual reader and a span recorder, where a service
// would have its exporters.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_otel")); err != nil {
		panic(err)
	}

	reader := sdkmetric.NewManualReader()
	meterProvider := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	defer func() { _ = meterProvider.Shutdown(ctx) }()
	spans := tracetest.NewSpanRecorder()
	tracerProvider := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	defer func() { _ = tracerProvider.Shutdown(ctx) }()

	tel, err := pgleaseotel.New(pgleaseotel.Opts{
		MeterProvider:  meterProvider,
		TracerProvider: tracerProvider,
		Table:          "example_otel",
	})
	if err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithTable("example_otel"), pglease.WithHook(tel.Hook))
	defer locker.Close(ctx)

	if _, err := locker.Claim(ctx, "nightly"); err != nil {
		panic(err)
	}

	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		panic(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != "pglease.claims" && m.Name != "pglease.leases.held" {
				continue
			}
			for _, p := range sum.DataPoints {
				if p.Value > 0 {
					fmt.Printf("%s{%s}: %d\n", m.Name, p.Attributes.Encoded(attribute.DefaultEncoder()), p.Value)
				}
			}
		}
	}
	for _, s := range spans.Ended() {
		fmt.Println(s.Name())
		for _, kv := range s.Attributes() {
			if kv.Key != "pglease.fence" && kv.Key != "pglease.holder" { // they vary from run to run
				fmt.Printf("  %s=%s\n", kv.Key, kv.Value.String())
			}
		}
	}
	// Output:
	// pglease.claims{pglease.outcome=acquired}: 1
	// pglease.leases.held{}: 1
	// pglease.claim
	//   db.system.name=postgresql
	//   db.collection.name=example_otel
	//   pglease.key=nightly
	//   db.operation.name=claim
	//   pglease.outcome=acquired
}
