package pglease

import (
	"regexp"
	"strings"

	"github.com/pglease/pglease/internal/driver"
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
	return l.waits.set.Waiters(key)
}

// DropReleaseNotify makes l's release statement notify nothing, as before
// waiting claims existed: benchmarks measure what the notification costs.
// Call it before l's first claim.
func DropReleaseNotify(l *Locker) {
	notify := "pg_notify(" + quoteChannel(l.waits.table) + ", l.key)"
	rewriteReleases(l, "DropReleaseNotify", func(sql string) string {
		sql = strings.Replace(sql, ", "+notify, "", 1)
		return strings.Replace(sql, "RETURNING "+notify, "RETURNING l.key", 1)
	}, "pg_notify")
}

// SyncRelease makes l's releases commit synchronously, waiting for the WAL
// flush as any statement does: what the asynchronous commit of the release
// saves, notification included, is measured against it.
func SyncRelease(l *Locker) {
	async := regexp.MustCompile(`\n\s+AND set_config\('synchronous_commit', 'off', true\) IS NOT NULL`)
	rewriteReleases(l, "SyncRelease", func(sql string) string {
		return async.ReplaceAllLiteralString(sql, "")
	}, "'synchronous_commit', 'off'")
}

// rewriteReleases gives l the fenced protocol with the release statements
// (sqlstmt.Release, sqlstmt.ReleaseOne) rewritten by rewrite, and panics,
// naming who, if either still contains gone afterwards.
func rewriteReleases(l *Locker, who string, rewrite func(string) string, gone string) {
	t := l.waits.table
	for _, tmpl := range []string{sqlstmt.Release, sqlstmt.ReleaseOne} {
		if strings.Contains(rewrite(t.Render(tmpl)), gone) {
			panic(who + ": release statement not recognised")
		}
	}
	l.proto = driver.Fenced(func(tmpl string) string {
		if tmpl == sqlstmt.Release || tmpl == sqlstmt.ReleaseOne {
			return rewrite(t.Render(tmpl))
		}
		return t.Render(tmpl)
	}, l.cfg.holder, l.cfg.ttl)
}

func quoteChannel(t driver.Table) string {
	return "'" + strings.ReplaceAll(channelOf(t), "'", "''") + "'"
}
