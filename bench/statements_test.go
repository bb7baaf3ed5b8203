package main

import (
	"strings"
	"testing"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// TestCheckStatements checks, with no server, that the common-path study
// refuses a raw variant that sends what no Locker sent, and a Locker that
// sends a claim or release the raw variant lacks when it runs one job at a
// time.
func TestCheckStatements(t *testing.T) {
	t.Parallel()
	claim, release := render(sqlstmt.Claim, "<table>"), render(sqlstmt.ReleaseOne, "<table>")
	burst, heartbeat := render(sqlstmt.ClaimAll, "<table>"), render(sqlstmt.Heartbeat, "<table>")
	for _, tc := range []struct {
		name        string
		locker, raw []string
		alone       bool
		refused     string // a statement the error names; "" when accepted
	}{
		{"TheSameStatements", []string{claim, release}, []string{claim, release}, true, ""},
		{"AHeartbeatBesideThem", []string{claim, heartbeat, release}, []string{claim, release}, true, ""},
		{"RawSendsWhatNoLockerSent", []string{claim, release}, []string{burst, release}, false, burst},
		{"ALockerAloneSendsAClaimRawLacks", []string{burst, claim, release}, []string{claim, release}, true, burst},
		{"ALockerOfManyRunsBurstsBesideThem", []string{burst, claim, release}, []string{claim, release}, false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := checkStatements(tc.locker, tc.raw, tc.alone)
			switch {
			case tc.refused == "" && err != nil:
				t.Fatalf("refused: %v", err)
			case tc.refused != "" && err == nil:
				t.Fatal("accepted")
			case tc.refused != "" && !strings.Contains(err.Error(), tc.refused):
				t.Fatalf("the error does not name the statement: %v", err)
			}
		})
	}
}
