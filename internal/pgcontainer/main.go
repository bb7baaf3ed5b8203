// Command pgcontainer runs a throwaway PostgreSQL in a Docker container with
// testcontainers-go, for internal/pgserver. It is a module of its own so that
// the Docker client stays out of the module graph of pglease's importers:
// internal/pgserver runs it with `go run` only when a Docker daemon answers.
//
// It speaks a line protocol. On stdout it prints "dsn <connection string>"
// once the container accepts connections. Then it reads commands on stdin
// and answers each with one line:
//
//	stop fast        "ok": Docker's stop (the image's stop signal, SIGINT)
//	stop immediate   "ok": SIGQUIT to the postmaster, then Docker's stop
//	start            "dsn <connection string>": the host port may change
//
// A failed command is answered "error <message>". When stdin ends (its
// parent closed it, or died), it removes the container and exits; Docker's
// reaper (Ryuk) removes it too should this program be killed.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/testcontainers/testcontainers-go"
	tcpostgres "github.com/testcontainers/testcontainers-go/modules/postgres"
)

const stopTimeout = 30 * time.Second

func main() {
	image := flag.String("image", "postgres:16-alpine", "PostgreSQL image")
	durable := flag.Bool("durable", false, "keep fsync, synchronous_commit and full_page_writes on")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("pgcontainer: ")
	if err := run(*image, *durable); err != nil {
		log.Print(err)
		os.Exit(1)
	}
}

func run(image string, durable bool) (err error) {
	defer func() {
		// testcontainers panics when the daemon does not answer as it expects.
		if r := recover(); r != nil {
			err = fmt.Errorf("testcontainers: %v", r)
		}
	}()
	cmd := []string{"postgres", "-c", "max_connections=300", "-c", "shared_buffers=128MB"}
	if !durable {
		cmd = append(cmd, "-c", "fsync=off", "-c", "synchronous_commit=off", "-c", "full_page_writes=off")
	}
	ctx := context.Background()
	ctr, err := tcpostgres.Run(ctx, image,
		testcontainers.WithLogger(log.Default()),
		testcontainers.WithCmd(cmd...),
		tcpostgres.BasicWaitStrategies(),
	)
	if ctr != nil {
		defer func() {
			if terr := testcontainers.TerminateContainer(ctr); terr != nil {
				err = errors.Join(err, fmt.Errorf("removing container: %w", terr))
			}
		}()
	}
	if err != nil {
		return fmt.Errorf("starting container %s: %w", image, err)
	}
	out := bufio.NewWriter(os.Stdout)
	reply := func(line string) error {
		if _, err := out.WriteString(line + "\n"); err != nil {
			return err
		}
		return out.Flush()
	}
	dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
	if err != nil {
		return fmt.Errorf("connection string: %w", err)
	}
	if err := reply("dsn " + dsn); err != nil {
		return err
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		answer, err := serve(ctx, ctr, strings.TrimSpace(in.Text()))
		if err != nil {
			answer = "error " + strings.ReplaceAll(err.Error(), "\n", " ")
		}
		if err := reply(answer); err != nil {
			return err
		}
	}
	return in.Err()
}

// serve runs one command and returns its answer.
func serve(ctx context.Context, ctr *tcpostgres.PostgresContainer, command string) (string, error) {
	switch command {
	case "stop immediate":
		// The exec may fail as the container dies under it; Stop follows.
		if code, _, err := ctr.Exec(ctx, []string{"kill", "-QUIT", "1"}); err != nil || code != 0 {
			log.Printf("SIGQUIT in container: exit code %d, %v", code, err)
		}
		fallthrough
	case "stop fast":
		timeout := stopTimeout
		if err := ctr.Stop(ctx, &timeout); err != nil {
			return "", fmt.Errorf("stopping container: %w", err)
		}
		return "ok", nil
	case "start":
		if err := ctr.Start(ctx); err != nil {
			return "", fmt.Errorf("starting container: %w", err)
		}
		dsn, err := ctr.ConnectionString(ctx, "sslmode=disable")
		if err != nil {
			return "", fmt.Errorf("connection string: %w", err)
		}
		return "dsn " + dsn, nil
	default:
		return "", fmt.Errorf("unknown command %q", command)
	}
}
