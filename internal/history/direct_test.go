package history

import (
	"fmt"
	"math/rand"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

var t0 = time.Now()

func at(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }

func TestFencesHandedOutAfterAnotherClaimReturnedMustBeGreater(t *testing.T) {
	ok := []Grant{
		{Key: "k", Holder: "a", Fence: 1, Call: at(0), Return: at(10)},
		{Key: "k", Holder: "b", Fence: 5, Call: at(5), Return: at(30)},
		{Key: "k", Holder: "c", Fence: 3, Call: at(6), Return: at(20)}, // concurrent with b's
		{Key: "k", Holder: "a", Fence: 6, Call: at(31), Return: at(40)},
		{Key: "j", Holder: "a", Fence: 2, Call: at(50), Return: at(60)}, // another key
	}
	assert.Empty(t, FencesGrow(ok))
	ok = append(ok, Grant{Key: "k", Holder: "c", Fence: 4, Call: at(35), Return: at(45)})
	problems := FencesGrow(ok)
	assert.Len(t, problems, 1)
	assert.Contains(t, problems[0], "c got fence 4")
}

func TestALeaseTrustedAfterAnotherHoldersTakeoverCommittedOverlaps(t *testing.T) {
	takeovers := []Takeover{{Key: "k", Holder: "b", Fence: 2, At: at(100)}}
	trustedBefore := []Lease{{Key: "k", Holder: "a", Fence: 1, Returned: at(0), LastTrusted: at(99)}}
	assert.Empty(t, Overlaps(trustedBefore, takeovers))
	trustedAfter := []Lease{{Key: "k", Holder: "a", Fence: 1, Returned: at(0), LastTrusted: at(101)}}
	assert.Len(t, Overlaps(trustedAfter, takeovers), 1)
	exempt := []Lease{{Key: "k", Holder: "a", Fence: 1, Returned: at(0), LastTrusted: at(101), Exempt: true}}
	assert.Empty(t, Overlaps(exempt, takeovers))
	// An older takeover, or the lease's own, is no overlap.
	assert.Empty(t, Overlaps(trustedAfter, []Takeover{{Key: "k", Holder: "b", Fence: 0, At: at(50)}, {Key: "k", Holder: "a", Fence: 1, At: at(0)}}))
	// Another key's takeover neither.
	assert.Empty(t, Overlaps(trustedAfter, []Takeover{{Key: "j", Holder: "b", Fence: 2, At: at(50)}}))
}

func TestALeaseTrustedAfterItsHoldersLaterLeaseWasHandedOutOverlaps(t *testing.T) {
	leases := []Lease{
		{Key: "k", Holder: "a", Fence: 1, Returned: at(0), LastTrusted: at(49)},
		{Key: "k", Holder: "a", Fence: 2, Returned: at(50), LastTrusted: at(80)},
	}
	assert.Empty(t, Overlaps(leases, nil))
	leases[0].LastTrusted = at(51)
	problems := Overlaps(leases, nil)
	assert.Len(t, problems, 1)
	assert.Contains(t, problems[0], "after its own fence 2")
}

func TestLedgerWritesOfAnOlderLeaseAfterANewerOneAreFound(t *testing.T) {
	rows := []LedgerRow{
		{Seq: 1, Key: "k", Fence: 1, Token: "t1"},
		{Seq: 2, Key: "k", Fence: 1, Token: "t2"},
		{Seq: 3, Key: "j", Fence: 7, Token: "t3"},
		{Seq: 4, Key: "k", Fence: 3, Token: "t4"},
	}
	assert.Empty(t, LedgerOrder(rows))
	rows = append(rows, LedgerRow{Seq: 5, Key: "k", Fence: 2, Token: "t5"})
	assert.Equal(t, []string{"k: a write of fence 2 (t5) committed after one of fence 3 (t4)"}, LedgerOrder(rows))
}

// overlapsByHand is Overlaps as its doc states it, one pair at a time.
func overlapsByHand(leases []Lease, takeovers []Takeover) map[string]bool {
	out := map[string]bool{}
	for _, l := range leases {
		if l.LastTrusted.IsZero() || l.Exempt {
			continue
		}
		for _, t := range takeovers {
			if t.Key == l.Key && t.Holder != l.Holder && t.Fence > l.Fence && t.At.Before(l.LastTrusted) {
				out[fmt.Sprintf("%s %s %d", l.Key, l.Holder, l.Fence)] = true
			}
		}
		for _, m := range leases {
			if m.Key == l.Key && m.Holder == l.Holder && m.Fence > l.Fence && !m.Returned.IsZero() && m.Returned.Before(l.LastTrusted) {
				out[fmt.Sprintf("%s %s %d", l.Key, l.Holder, l.Fence)] = true
			}
		}
	}
	return out
}

func TestOverlapsFindsWhatComparingEveryPairFinds(t *testing.T) {
	rnd := rand.New(rand.NewSource(1))
	found := 0
	for round := range 200 {
		var (
			leases    []Lease
			takeovers []Takeover
		)
		for i := range 30 {
			key, holder := fmt.Sprintf("k%d", rnd.Intn(2)), fmt.Sprintf("h%d", rnd.Intn(3))
			l := Lease{Key: key, Holder: holder, Fence: int64(i + 1), Returned: at(rnd.Intn(100)), Exempt: rnd.Intn(10) == 0}
			if rnd.Intn(5) > 0 {
				l.LastTrusted = at(rnd.Intn(120))
			}
			if rnd.Intn(6) == 0 {
				l.Returned = time.Time{}
			}
			leases = append(leases, l)
			takeovers = append(takeovers, Takeover{Key: key, Holder: holder, Fence: int64(i + 1), At: at(rnd.Intn(100))})
		}
		want := overlapsByHand(leases, takeovers)
		found += len(want)
		got := Overlaps(leases, takeovers)
		require.Len(t, got, len(want), "round %d", round)
		for _, p := range got {
			var key, holder string
			var fence int64
			_, err := fmt.Sscanf(strings.ReplaceAll(p, "'s fence", " fence"), "%s %s fence %d", &key, &holder, &fence)
			require.NoError(t, err, p)
			assert.True(t, want[fmt.Sprintf("%s %s %d", strings.TrimSuffix(key, ":"), holder, fence)], "round %d: %s", round, p)
		}
	}
	assert.Positive(t, found, "the histories drawn have overlaps to find")
}

func TestALeaseHandedOutWithinAnOutageOfTheSynchronousStandbyWasNotConfirmed(t *testing.T) {
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	outages := []Outage{{From: at(100), Until: at(200)}}
	grants := []Grant{
		{Key: "k", Holder: "a", Fence: 1, Call: at(50), Return: at(150)},  // called before: it may have committed before
		{Key: "k", Holder: "b", Fence: 2, Call: at(120), Return: at(180)}, // within: unconfirmed
		{Key: "k", Holder: "c", Fence: 3, Call: at(150), Return: at(250)}, // returned after: let go by the end
	}
	problems := ConfirmedGrants(grants, outages)
	require.Len(t, problems, 1)
	assert.Contains(t, problems[0], "b got fence 2")
	assert.Empty(t, ConfirmedGrants(grants, nil))
}
