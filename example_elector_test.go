package pglease_test

import (
	"context"
	"fmt"
	"time"

	"github.com/go-co-op/gocron/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
)

// All the jobs of a service on one replica, the leader: gocron asks the
// Elector before every run, and only the replica holding the leadership
// lease runs jobs.
func ExampleNewElector() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, databaseURL())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool, pglease.WithTable("example_elector")); err != nil {
		panic(err)
	}

	locker := pglease.NewLocker(pool, pglease.WithTable("example_elector"), pglease.WithTTL(15*time.Second))
	defer locker.Close(ctx) // closes its Electors first
	// The same key on every replica of the service.
	elector, err := pglease.NewElector(locker, "gocron-leader",
		pglease.WithTimeout(2*time.Second)) // terms of its own; the Locker's holder and heartbeat
	if err != nil {
		panic(err)
	}
	defer elector.Close(ctx) // resigns: a follower leads at once

	s, err := gocron.NewScheduler(gocron.WithDistributedElector(elector))
	if err != nil {
		panic(err)
	}
	ran := make(chan struct{})
	_, err = s.NewJob(gocron.OneTimeJob(gocron.OneTimeJobStartImmediately()),
		gocron.NewTask(func() {
			leader, _ := elector.Leader() // the leadership lease
			fmt.Println("leader runs the job, fenced:", leader.Fence() > 0)
			close(ran)
		}),
		gocron.WithName("compact"),
	)
	if err != nil {
		panic(err)
	}
	s.Start()
	<-ran
	_ = s.Shutdown()
	// Output: leader runs the job, fenced: true
}
