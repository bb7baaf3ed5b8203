package leaseset_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/leaseset"
)

func TestSet(t *testing.T) {
	t.Parallel()
	a := leaseset.Of(pglease.Event{Kind: pglease.EventAcquired, Holder: "h", Key: "job", Fence: 7})
	later := leaseset.ID{Holder: "h", Key: "job", Fence: 8}
	for _, tc := range []struct {
		name  string
		steps func(s *leaseset.Set) []bool
		want  []bool
	}{
		{"AcquiredThenEndedCountsOnce", func(s *leaseset.Set) []bool { return []bool{s.Acquired(a), s.Ended(a)} }, []bool{true, true}},
		{"LostThenReleaseFailedEndsOnce", func(s *leaseset.Set) []bool { return []bool{s.Acquired(a), s.Ended(a), s.Ended(a)} }, []bool{true, true, false}},
		{"AcquiredTwiceCountsOnce", func(s *leaseset.Set) []bool { return []bool{s.Acquired(a), s.Acquired(a)} }, []bool{true, false}},
		{"EndOfALeaseNeverSeenCountsNothing", func(s *leaseset.Set) []bool { return []bool{s.Ended(a)} }, []bool{false}},
		{"AReclaimIsAnotherLease", func(s *leaseset.Set) []bool {
			return []bool{s.Acquired(a), s.Acquired(later), s.Ended(a), s.Ended(later)}
		}, []bool{true, true, true, true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var s leaseset.Set
			assert.Equal(t, tc.want, tc.steps(&s))
		})
	}
}
