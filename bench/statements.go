package main

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// sent counts the statements a variant's pool sends while its turns are
// measured, by text, the variant's table named "<table>" in it: what the
// study checks the raw variant against.
type sent struct {
	table string
	on    atomic.Bool
	mu    sync.Mutex
	n     map[string]int64
}

func newSent(table string) *sent { return &sent{table: table, n: map[string]int64{}} }

func (s *sent) TraceQueryStart(ctx context.Context, _ *pgx.Conn, data pgx.TraceQueryStartData) context.Context {
	if s.on.Load() {
		s.mu.Lock()
		s.n[strings.ReplaceAll(data.SQL, s.table, "<table>")]++
		s.mu.Unlock()
	}
	return ctx
}

func (s *sent) TraceQueryEnd(context.Context, *pgx.Conn, pgx.TraceQueryEndData) {}

// total is how many statements were counted.
func (s *sent) total() int64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var n int64
	for _, c := range s.n {
		n += c
	}
	return n
}

// texts are the statements counted, in order.
func (s *sent) texts() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]string, 0, len(s.n))
	for t := range s.n {
		out = append(out, t)
	}
	slices.Sort(out)
	return out
}

// claimsAndReleases are the statement templates that claim or release a
// lease: what a job run sends, as against the Locker's heartbeat and its
// reads of its table's shape.
var claimsAndReleases = []string{
	sqlstmt.Claim, sqlstmt.ClaimAll, sqlstmt.ClaimTick,
	sqlstmt.ReleaseOne, sqlstmt.ReleaseOneQuiet, sqlstmt.Release, sqlstmt.ReleaseQuiet,
	sqlstmt.ReleaseOneRun, sqlstmt.ReleaseOneRunQuiet, sqlstmt.ReleaseRuns, sqlstmt.ReleaseRunsQuiet,
}

// checkStatements fails unless the raw variant sent only statements the
// Locker sent in the same case (raw is what a Locker sends, never a
// cheaper statement of its own), and, when alone is true (one job run at a
// time: nothing for the Locker to send together), unless every claim and
// release the Locker sent is one the raw variant sent too.
func checkStatements(locker, raw []string, alone bool) error {
	for _, t := range raw {
		if !slices.Contains(locker, t) {
			return fmt.Errorf("the raw variant sent a statement no Locker sent in the same case: %s", t)
		}
	}
	if !alone {
		return nil
	}
	for _, t := range locker {
		if isClaimOrRelease(t) && !slices.Contains(raw, t) {
			return fmt.Errorf("a Locker sent a claim or release the raw variant did not: %s", t)
		}
	}
	return nil
}

// isClaimOrRelease reports whether text, a statement with its table named
// "<table>", is one of claimsAndReleases.
func isClaimOrRelease(text string) bool {
	for _, tmpl := range claimsAndReleases {
		if render(tmpl, "<table>") == text {
			return true
		}
	}
	return false
}
