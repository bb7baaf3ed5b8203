// Package sqlstmt holds every SQL text pglease sends: the statements of its
// lease protocol (claim, burst claim, heartbeat, release, with and without
// the fence column), of Guard, of waiting claims, of the operator's
// functions and of the schema, and the rendering of their templates,
// written once (audit_test.go checks every statement that changes lease
// rows, and that no SQL lives elsewhere): the library runs them,
// and the benchmarks send the very same text raw through a pool as the
// baseline a Locker is measured against.
//
// A statement is a template: Render fills {table}, {seq}, {seqlit} and
// {chanlit} with the quoted names of one lease table.
package sqlstmt

import (
	"crypto/sha256"
	"encoding/hex"
	"strings"
	"unicode/utf8"

	"github.com/jackc/pgx/v5"
)

// MaxIdentifierLen is PostgreSQL's NAMEDATALEN - 1. A longer name would be
// truncated silently by the server.
const MaxIdentifierLen = 63

// FenceSeqSuffix names the sequence that issues fences, beside its table.
const FenceSeqSuffix = "_fence_seq"

// channelPrefix starts the name of the channel a table's releases are
// notified on.
const channelPrefix = "pglease:"

// channelHashLen is the number of hex digits of the hash that ends a
// channel name too long to be the table's name.
const channelHashLen = 16

// FenceSeq is the sequence that issues the fences of table (one part, or
// schema and name): beside it, named after it.
func FenceSeq(table pgx.Identifier) pgx.Identifier {
	seq := append(pgx.Identifier{}, table...)
	seq[len(seq)-1] += FenceSeqSuffix
	return seq
}

// Channel is the channel the release statement notifies the released keys
// on: "pglease:" and the table's name as given to WithTable. pg_notify
// refuses a channel of NAMEDATALEN (64) bytes or more, and LISTEN would
// truncate it silently, so a longer name keeps a readable head (cut on a
// character boundary) and ends in "~" and 16 hex digits of the SHA-256 of
// the whole name: stable across processes and versions, and distinct for
// distinct names. Lockers wake each other only if they name the table the
// same way ("lease" and "public.lease" are two channels); a waiter that
// misses a notification still wakes at its backoff and at the holder's
// expiry.
func Channel(name string) string {
	ch := channelPrefix + name
	if len(ch) <= MaxIdentifierLen {
		return ch
	}
	sum := sha256.Sum256([]byte(name))
	tail := "~" + hex.EncodeToString(sum[:])[:channelHashLen]
	head := name[:MaxIdentifierLen-len(channelPrefix)-len(tail)]
	for !utf8.ValidString(head) {
		head = head[:len(head)-1]
	}
	return channelPrefix + head + tail
}

// Render fills a statement template for table (one part, or schema and
// name): {table} becomes the quoted table name, {seq} the quoted name of
// its fence sequence, {seqlit} that name as a string literal for nextval(),
// {chanlit} its release channel (Channel) as a string literal, {chan}
// that channel as a quoted identifier, {runs} the quoted name of its
// ledger of runs (Runs) and {runsindex} the name of the ledger's index
// (an index is made in its table's schema).
// Identifiers are quoted by pgx.Identifier.Sanitize, and the literals
// double any single quote, so no name can change the statement.
func Render(tmpl string, table pgx.Identifier) string {
	seq := FenceSeq(table).Sanitize()
	runs := Runs(table)
	index := append(pgx.Identifier{}, runs...)
	index[len(index)-1] += "_key"
	return strings.NewReplacer(
		"{table}", table.Sanitize(),
		"{runs}", runs.Sanitize(),
		"{runsindex}", pgx.Identifier{index[len(index)-1]}.Sanitize(),
		"{seq}", seq,
		"{seqlit}", literal(seq),
		"{chanlit}", literal(Channel(strings.Join(table, "."))),
		"{chan}", pgx.Identifier{Channel(strings.Join(table, "."))}.Sanitize(),
	).Replace(tmpl)
}

func literal(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }

// PartNames are the names pglease's statements give their own parts (WITH
// queries): h, mine, extended (heartbeat), r, released (release), server
// (the admin listing), instant, nearest, prev, taken, logged, closed, skip
// (the claim of a tick), ran (the release of a tick's run). Inside such a statement an unqualified table of the
// same name would be read as that part, not as the table: the lease table
// may carry one of these names only with its schema (WithTable refuses
// the bare name and says so).
var PartNames = []string{"h", "mine", "extended", "r", "released", "server", "instant", "nearest", "prev", "taken", "logged", "closed", "skip", "ran"}
