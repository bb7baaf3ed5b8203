package pgleaseotel

import (
	"context"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/google/uuid"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// jobStatusKey is the gocron status of a job run.
const jobStatusKey = attribute.Key("pglease.job.status")

// JobMonitor is a gocron.Monitor that counts a scheduler's job runs by
// status, so that the runs its distributed locker skipped (gocron.Skip:
// Lock returned an error, another replica held the key) sit next to the
// ones that ran (gocron.Success, gocron.Fail) in pglease.job.runs, and
// times them in pglease.job.duration. Pass it to gocron.WithMonitor on the
// scheduler whose gocron.WithDistributedLocker is a Locker fed by this
// Telemetry.
func (t *Telemetry) JobMonitor() gocron.Monitor { return jobMonitor{t} }

type jobMonitor struct{ t *Telemetry }

var _ gocron.Monitor = jobMonitor{}

// IncrementJob implements gocron.Monitor: gocron calls it once per run,
// skipped runs included.
func (m jobMonitor) IncrementJob(_ uuid.UUID, name string, _ []string, status gocron.JobStatus) {
	m.t.jobRuns.Add(context.Background(), 1, m.attrs(name, jobStatusKey.String(string(status))))
}

// RecordJobTiming implements gocron.Monitor: gocron calls it for every run
// that ran, whatever its outcome.
func (m jobMonitor) RecordJobTiming(start, end time.Time, _ uuid.UUID, name string, _ []string) {
	m.t.jobTime.Record(context.Background(), end.Sub(start).Seconds(), m.attrs(name))
}

func (m jobMonitor) attrs(name string, attrs ...attribute.KeyValue) metric.MeasurementOption {
	if m.t.perKey {
		attrs = append(attrs, keyKey.String(name)) // a job's name is its lease key
	}
	return metric.WithAttributes(attrs...)
}
