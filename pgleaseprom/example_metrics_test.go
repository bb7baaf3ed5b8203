package pgleaseprom_test

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseprom"
)

// databaseURL stands for your service's connection string.
func databaseURL() string { return pgtest.Server.DSN() }

// Export what a Locker does as Prometheus metrics: register the Metrics,
// pass its Hook to the Locker.
func ExampleNew() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_metrics")); err != nil {
		panic(err)
	}

	m := pgleaseprom.New(pgleaseprom.Opts{Namespace: "myservice"})
	reg := prometheus.NewRegistry() // or prometheus.MustRegister(m): served by promhttp.Handler()
	reg.MustRegister(m)
	locker := pglease.NewLocker(pool, pglease.WithTable("example_metrics"), pglease.WithHook(m.Hook))
	defer locker.Close(ctx)

	if _, err := locker.Claim(ctx, "nightly"); err != nil {
		panic(err)
	}
	families, err := reg.Gather() // what a scrape of reg reads
	if err != nil {
		panic(err)
	}
	for _, f := range families {
		if f.GetName() != "myservice_claims_total" && f.GetName() != "myservice_leases_held" {
			continue
		}
		for _, s := range f.GetMetric() {
			if v := s.GetGauge().GetValue() + s.GetCounter().GetValue(); v > 0 {
				fmt.Print(f.GetName())
				for _, l := range s.GetLabel() {
					fmt.Printf(" %s=%s", l.GetName(), l.GetValue())
				}
				fmt.Println(":", v)
			}
		}
	}
	// Output:
	// myservice_claims_total outcome=acquired: 1
	// myservice_leases_held: 1
}
