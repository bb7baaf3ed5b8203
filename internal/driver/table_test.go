package driver

import (
	"strings"
	"testing"
)

func TestTable(t *testing.T) {
	t.Parallel()
	t.Run("DrewBackwardsNamesTheFix", func(t *testing.T) {
		t.Parallel()
		table, err := ParseTable("jobs.lease")
		if err != nil {
			t.Fatal(err)
		}
		msg := table.DrewBackwards(3, 11).Error()
		for _, want := range []string{"fence 3", "drew 11", `SELECT setval('"jobs"."lease_fence_seq"', 11 + 1000000)`} {
			if !strings.Contains(msg, want) {
				t.Errorf("%q does not say %q", msg, want)
			}
		}
	})
}
