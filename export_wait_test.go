package pglease

import (
	"regexp"
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
	notify := "pg_notify(" + quoteChannel(l.waits.table) + ", l.key)"
	p.releaseSQL = strings.Replace(p.releaseSQL, ", "+notify, "", 1)
	p.releaseOneSQL = strings.Replace(p.releaseOneSQL, "RETURNING "+notify, "RETURNING l.key", 1)
	if !strings.Contains(p.releaseSQL, "pg_notify") && !strings.Contains(p.releaseOneSQL, "pg_notify") {
		return
	}
	panic("DropReleaseNotify: release statement not recognised")
}

// SyncRelease makes l's releases commit synchronously, waiting for the WAL
// flush as any statement does: what the asynchronous commit of the release
// saves, notification included, is measured against it.
func SyncRelease(l *Locker) {
	p := l.proto.(serializationRetry).protocol.(*fenced)
	async := regexp.MustCompile(`\n\s+AND set_config\('synchronous_commit', 'off', true\) IS NOT NULL`)
	p.releaseSQL = async.ReplaceAllLiteralString(p.releaseSQL, "")
	p.releaseOneSQL = async.ReplaceAllLiteralString(p.releaseOneSQL, "")
	if strings.Contains(p.releaseSQL+p.releaseOneSQL, "'synchronous_commit', 'off'") {
		panic("SyncRelease: release statement not recognised")
	}
}

func quoteChannel(t table) string { return "'" + strings.ReplaceAll(t.channel(), "'", "''") + "'" }
