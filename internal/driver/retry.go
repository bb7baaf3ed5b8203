package driver

import (
	"context"
	"math/rand/v2"
	"time"
)

// SerializationAttempts bounds how often one statement is sent when the
// server keeps failing it with a serialization failure.
const SerializationAttempts = 10

// RetrySerialization runs send until it returns anything but a
// serialization failure (SQLSTATE 40001), at most SerializationAttempts
// times, or until ctx ends, waiting a little longer each time for the
// conflicting transactions to end, with jitter so that statements that
// failed together do not collide again. Each statement pglease sends is a
// transaction of its own that wrote nothing when it failed so: sending it
// again is safe and answers with a fresh snapshot.
func RetrySerialization(ctx context.Context, send func() error) error {
	var err error
	for attempt := 1; ; attempt++ {
		err = send()
		if !Is(err, SerializationFailure) || attempt == SerializationAttempts {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(rand.N(time.Duration(attempt) * 2 * time.Millisecond)):
		}
	}
}
