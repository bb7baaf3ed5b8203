// Package faults holds the suites that break things on purpose and measure
// what a Locker does about it: injected network faults (a TCP proxy between
// a pool and PostgreSQL), backends terminated server-side, server crashes,
// restarts and failovers to a standby, a stepped server clock (libfaketime),
// the guarded-write chaos run and the soak. They use only pglease's public
// API and the internal test harness, and start the private servers they
// stop or crash themselves.
//
// README's `go test -race ./...` runs them with everything else; alone:
//
//	go test -race -count=1 -v ./faults/
//
// Each test logs its measured figures on lines starting with "figures:".
package faults
