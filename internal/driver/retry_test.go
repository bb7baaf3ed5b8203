package driver

import (
	"context"
	"errors"
	"testing"
)

func TestRetrySerialization(t *testing.T) {
	t.Parallel()
	// failing is a send that fails with err its first n times, then succeeds.
	failing := func(n int, err error) (func() error, *int) {
		sent := 0
		return func() error {
			sent++
			if sent <= n {
				return err
			}
			return nil
		}, &sent
	}
	t.Run("SendsAgainUntilTheStatementSucceeds", func(t *testing.T) {
		t.Parallel()
		send, sent := failing(3, server(SerializationFailure, ""))
		if err := RetrySerialization(context.Background(), send); err != nil || *sent != 4 {
			t.Errorf("got %v after %d sends, want success after 4", err, *sent)
		}
	})
	t.Run("NeverSendsAgainOnAnyOtherError", func(t *testing.T) {
		t.Parallel()
		for _, fail := range []error{server(LockNotAvailable, ""), server("40P01", ""), errors.New("unexpected EOF")} {
			send, sent := failing(1, fail)
			if err := RetrySerialization(context.Background(), send); !errors.Is(err, fail) || *sent != 1 {
				t.Errorf("got %v after %d sends, want %v after 1", err, *sent, fail)
			}
		}
	})
	t.Run("GivesUpAfterItsAttempts", func(t *testing.T) {
		t.Parallel()
		send, sent := failing(SerializationAttempts+5, server(SerializationFailure, ""))
		if err := RetrySerialization(context.Background(), send); !Is(err, SerializationFailure) || *sent != SerializationAttempts {
			t.Errorf("got %v after %d sends, want the serialization failure after %d", err, *sent, SerializationAttempts)
		}
	})
	t.Run("StopsOnceTheContextEnded", func(t *testing.T) {
		t.Parallel()
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		send, sent := failing(SerializationAttempts, server(SerializationFailure, ""))
		if err := RetrySerialization(ctx, send); !Is(err, SerializationFailure) || *sent != 1 {
			t.Errorf("got %v after %d sends, want the serialization failure after 1", err, *sent)
		}
	})
}
