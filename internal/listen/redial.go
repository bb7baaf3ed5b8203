package listen

import "time"

const (
	// minRelisten and maxRelisten bound the pause before LISTEN is tried
	// again after the listening connection failed, or could not be set up.
	minRelisten = 100 * time.Millisecond
	maxRelisten = 30 * time.Second
	// minReprobe and maxReprobe bound the pause before LISTEN is tried
	// again after a probe that did not come back: a pooler that drops
	// every notification costs one probe per pause, a link that was slow
	// for a moment is trusted again soon.
	minReprobe = 5 * time.Second
	maxReprobe = 5 * time.Minute
	// stableListen is how long a connection must have listened for its
	// failure to start the pauses over from minRelisten: a server that
	// ends every connection soon after LISTEN (idle_session_timeout, a
	// proxy's idle timeout) is dialed less and less often, not in a loop.
	stableListen = 10 * time.Second
)

// Redial is the pause before a Listener tries LISTEN again. The zero value
// is ready to use.
type Redial struct {
	fail  time.Duration // the next pause after a failure; 0: minRelisten
	probe time.Duration // the next pause after a lost probe; 0: minReprobe
}

// Failed returns the pause after a connection failed: listened is how long
// it had listened since its probe came back (0 if it never did), noDelivery
// says that its probe did not come back. The pauses double, each kind up
// to its cap; one after a connection that listened at least stableListen
// starts over.
func (r *Redial) Failed(listened time.Duration, noDelivery bool) time.Duration {
	if noDelivery {
		p := max(r.probe, minReprobe)
		r.probe = min(2*p, maxReprobe)
		return p
	}
	if listened >= stableListen {
		r.fail = 0
	}
	p := max(r.fail, minRelisten)
	r.fail = min(2*p, maxRelisten)
	return p
}

// Delivered records that a probe came back: the next lost one is tried
// again after minReprobe.
func (r *Redial) Delivered() { r.probe = 0 }
