package main

import "github.com/pglease/pglease"

// listenOptions are the follower options of the path viaBouncerListen: a
// direct connection to dsn for LISTEN alone.
func listenOptions(dsn string) []pglease.Option {
	return []pglease.Option{pglease.WithListenDSN(dsn)}
}
