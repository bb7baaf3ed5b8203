package pglease

import (
	"strings"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// ChannelFor is the channel the release statement of table name notifies.
func ChannelFor(name string) string { return sqlstmt.Channel(name) }

// ListenerPID is the backend pid of l's listening connection, 0 before it
// listened.
func ListenerPID(l *Locker) uint32 {
	l.waits.mu.Lock()
	defer l.waits.mu.Unlock()
	return l.waits.pid
}

// Waiters is the number of l's claims waiting for key.
func Waiters(l *Locker, key string) int {
	l.waits.mu.Lock()
	defer l.waits.mu.Unlock()
	if g := l.waits.groups[key]; g != nil {
		return g.users
	}
	return 0
}

// DropReleaseNotify makes l's release statement notify nothing, as before
// waiting claims existed: benchmarks measure what the notification costs.
// Call it before l's first claim.
func DropReleaseNotify(l *Locker) {
	p := l.proto.(serializationRetry).protocol.(*fenced)
	p.releaseSQL = strings.Replace(p.releaseSQL, ", pg_notify("+quoteChannel(l.waits.table)+", l.key)", "", 1)
	if !strings.Contains(p.releaseSQL, "pg_notify") {
		return
	}
	panic("DropReleaseNotify: release statement not recognised")
}

func quoteChannel(t table) string { return "'" + strings.ReplaceAll(t.channel(), "'", "''") + "'" }
