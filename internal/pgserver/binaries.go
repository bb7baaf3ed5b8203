package pgserver

// BinDir returns the directory of the local PostgreSQL server binaries
// (initdb, postgres, pg_ctl, pg_basebackup), found as Start finds them.
// It is for harnesses that run servers of their own, such as a primary and
// a standby.
func BinDir() (string, error) { return findBinDir() }
