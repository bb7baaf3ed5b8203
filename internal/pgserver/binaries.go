package pgserver

import (
	"os"
	"syscall"
)

// BinDir returns the directory of the local PostgreSQL server binaries
// (initdb, postgres, pg_ctl, pg_basebackup), found as Start finds them.
// It is for harnesses that run servers of their own, such as a primary and
// a standby.
func BinDir() (string, error) { return findBinDir() }

// ServerCredential returns the credentials to run the server binaries as:
// the "postgres" user when running as root, because PostgreSQL refuses to
// run as root, and nil (the current user) otherwise.
func ServerCredential() (*syscall.Credential, error) {
	if os.Geteuid() != 0 {
		return nil, nil
	}
	return postgresUser()
}
