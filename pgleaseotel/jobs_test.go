package pgleaseotel_test

import (
	"testing"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseotel"
)

func TestJobMonitor(t *testing.T) {
	t.Parallel()

	t.Run("SkipsBesideRuns", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		tel := newTelemetry(t, pgleaseotel.Opts{PerKey: true})
		other := pgtest.Locker(t, pool, table, "other")
		_, err := other.Claim(ctx, "report")
		require.NoError(t, err)
		l := pgtest.Locker(t, pool, table, "a", pglease.WithHook(tel.Hook))

		s, err := gocron.NewScheduler(gocron.WithDistributedLocker(l), gocron.WithMonitor(tel.JobMonitor()))
		require.NoError(t, err)
		t.Cleanup(func() { _ = s.Shutdown() })
		ran := make(chan string, 2)
		for _, name := range []string{"report", "ledger"} {
			_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
				gocron.NewTask(func() { ran <- name }), gocron.WithName(name))
			require.NoError(t, err)
		}
		s.Start()
		runs := func(status, key string) int64 {
			n, _ := tel.lookup("pglease.job.runs",
				attribute.String("pglease.job.status", status), attribute.String("pglease.key", key))
			return n
		}
		require.Eventually(t, func() bool { return runs("skip", "report") == 1 && runs("success", "ledger") == 1 },
			10*time.Second, 5*time.Millisecond, "the held job is skipped, the other runs")
		assert.Equal(t, "ledger", <-ran)
		assert.Zero(t, runs("success", "report"))
		assert.Equal(t, int64(1), tel.sum(t, "pglease.claims", outcome("held"), attribute.String("pglease.key", "report")),
			"the skip is the claim that found the key held")
		require.Eventually(t, func() bool {
			m, ok := tel.metric(t, "pglease.job.duration")
			return ok && m.Unit == "s"
		}, 10*time.Second, 5*time.Millisecond, "the run is timed")
		assert.Equal(t, uint64(1), tel.histogram(t, "pglease.job.duration", attribute.String("pglease.key", "ledger")).Count)
	})
}
