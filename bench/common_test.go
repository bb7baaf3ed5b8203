package main

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/bench/internal/lab"
)

// TestCommonPathRawIsTheLockers runs the common-path study's job run at
// W = 1 and its contended key briefly on a private server: the raw
// variant sends what a Locker sends (the study fails otherwise), each
// variant's job run costs two statements, and the client's costs are read.
func TestCommonPathRawIsTheLockers(t *testing.T) {
	ctx := context.Background()
	db, err := lab.Start(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = db.Close() })
	stats, err := pgx.Connect(ctx, db.DSN())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = stats.Close(context.Background()) })
	postmaster := lab.PostmasterPID(ctx, db.Pool)
	for _, tc := range []struct {
		name      string
		workers   int
		contended bool
	}{{"job run, W=1", 1, false}, {"contended key, 8 replicas", 8, true}} {
		points, err := measureCase(ctx, stats, db.DSN(), postmaster, tc.name, tc.workers, tc.contended, 300*time.Millisecond, 1)
		if err != nil {
			t.Fatal(err)
		}
		for _, p := range points {
			if p.Runs <= 0 || p.ClientCPU <= 0 || p.Allocs <= 0 {
				t.Errorf("%s, %s: %.0f runs/s, %.0f µs of client CPU and %.0f allocations per run; want each above 0", p.Case, p.Variant, p.Runs, p.ClientCPU, p.Allocs)
			}
			if tc.contended {
				continue // a losing attempt costs its claim alone: more than 2 statements per run
			}
			if p.Statements < 2 || p.Statements > 2.2 {
				t.Errorf("%s, %s: %.2f statements per job run, want 2 (a claim and a release; a heartbeat at most beside them)", p.Case, p.Variant, p.Statements)
			}
		}
	}
}
