package pglease

import (
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestBurstClaimJudgesAndReportsEachRowExactlyAsAClaimAlone keeps
// claimAllSQL's conflict arm, guard and RETURNING identical to claimSQL's:
// a burst must hand out exactly what the same claims alone would.
func TestBurstClaimJudgesAndReportsEachRowExactlyAsAClaimAlone(t *testing.T) {
	tail := func(sql string) string {
		_, after, ok := strings.Cut(sql, "ON CONFLICT")
		if !ok {
			t.Fatalf("no ON CONFLICT in %s", sql)
		}
		return after
	}
	alone := tail(sqlstmt.Claim)
	burst := strings.Replace(tail(sqlstmt.ClaimAll), "RETURNING key, ", "RETURNING ", 1)
	if alone != burst {
		t.Fatalf("claimAllSQL judges rows differently from claimSQL:\nalone:\n%s\nburst:\n%s", alone, burst)
	}
}
