package pgtest

import (
	"context"
	"strings"
	"sync"

	"github.com/jackc/pgx/v5"
)

// Statements is a pgx tracer that counts pglease's statements by kind
// (StatementKind).
type Statements struct {
	mu     sync.Mutex
	counts map[string]int
}

// TraceQueryStart implements pgx.QueryTracer.
func (c *Statements) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.counts == nil {
		c.counts = make(map[string]int)
	}
	c.counts[StatementKind(data.SQL)]++
	return ctx
}

// TraceQueryEnd implements pgx.QueryTracer.
func (c *Statements) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// Count returns how many statements of kind were sent since the last Reset.
func (c *Statements) Count(kind string) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.counts[kind]
}

// Reset sets every count back to zero.
func (c *Statements) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.counts = nil
}

// StatementKind names pglease's statements: claim, heartbeat, release,
// tablecheck, or other.
func StatementKind(sql string) string {
	switch {
	case strings.Contains(sql, "collisdeterministic"), strings.Contains(sql, "pg_sequence_last_value("):
		return "tablecheck" // the reads of a table before a Locker's first claim of it, and in Migrate
	case strings.HasPrefix(sql, "INSERT INTO"), strings.Contains(sql, "ON CONFLICT (key) DO UPDATE"):
		return "claim" // alone, in a burst, or of a tick (a WITH statement)
	case strings.HasPrefix(sql, "SELECT holder, fence, expires_at > clock_timestamp()"):
		return "other" // the read of a row before a give-back: it commits asynchronously too
	case strings.Contains(sql, "'synchronous_commit', 'off'"):
		return "release" // one or many (Close): with that read, the only statements that commit asynchronously
	case strings.Contains(sql, "unnest("):
		return "heartbeat"
	case strings.HasPrefix(sql, "UPDATE") && strings.Contains(sql, "GREATEST("):
		return "release"
	default:
		return "other"
	}
}
