package history

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
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

func TestLedgerWritesOfAnOlderMandateAfterANewerOneAreFound(t *testing.T) {
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
