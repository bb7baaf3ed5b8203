// Package lab holds what the studies of bench and bench/scaling share:
// the durable private server they measure, the server's CPU time read from
// /proc, and how they write their CSV files and SVG plots.
package lab

import (
	"context"
	"encoding/csv"
	"os"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease/internal/pgserver"
)

// DB is a durable private server (fsync and synchronous_commit on) and a
// pool on it.
type DB struct {
	*pgserver.Server
	Pool *pgxpool.Pool
}

// Start creates the directory out, where a study writes its results, then
// starts a durable private server and opens a pool on it. Close closes
// both.
func Start(ctx context.Context, out string) (*DB, error) {
	if err := os.MkdirAll(out, 0o755); err != nil {
		return nil, err
	}
	srv, err := pgserver.Start(ctx, pgserver.Options{Durable: true, Private: true})
	if err != nil {
		return nil, err
	}
	pool, err := pgxpool.New(ctx, srv.DSN())
	if err != nil {
		_ = srv.Close()
		return nil, err
	}
	return &DB{Server: srv, Pool: pool}, nil
}

// Close closes the pool, then stops the server and removes its data.
func (db *DB) Close() error {
	db.Pool.Close()
	return db.Server.Close()
}

// PostmasterPID is the process id of the server's postmaster: the parent of
// a backend of pool, or -1 when it cannot be read. It is only meaningful
// for a server on this host.
func PostmasterPID(ctx context.Context, pool *pgxpool.Pool) int {
	var backend int
	if err := pool.QueryRow(ctx, "SELECT pg_backend_pid()").Scan(&backend); err != nil {
		return -1
	}
	f := procStat(backend)
	if len(f) < 2 {
		return -1
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// procStat is the fields of /proc/pid/stat after the command name, or nil
// unless the process is a postgres one.
func procStat(pid int) []string {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return nil
	}
	s := string(stat)
	open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
	if open < 0 || closing < open || s[open+1:closing] != "postgres" {
		return nil
	}
	return strings.Fields(s[closing+1:])
}

// ServerCPU is the user and system CPU time, in seconds, of the postmaster
// and its children (backends, WAL writer, checkpointer...), or -1 when it
// cannot be read (a server in a container, or not Linux). Other servers on
// the host are not counted.
func ServerCPU(postmaster int) float64 {
	if postmaster <= 0 {
		return -1
	}
	dirs, err := os.ReadDir("/proc")
	if err != nil {
		return -1
	}
	const ticksPerSecond = 100 // USER_HZ on Linux
	var total int64
	found := false
	for _, d := range dirs {
		pid, err := strconv.Atoi(d.Name())
		if err != nil {
			continue
		}
		f := procStat(pid)
		if len(f) < 13 || pid != postmaster && f[1] != strconv.Itoa(postmaster) {
			continue
		}
		utime, _ := strconv.ParseInt(f[11], 10, 64)
		stime, _ := strconv.ParseInt(f[12], 10, 64)
		total += utime + stime
		found = true
	}
	if !found {
		return -1
	}
	return float64(total) / ticksPerSecond
}

// WriteCSV writes rows, the first being the header, to the file at path.
func WriteCSV(path string, rows [][]string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	w := csv.NewWriter(f)
	if err := w.WriteAll(rows); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}
