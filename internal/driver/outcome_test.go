package driver

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

func TestOutcome(t *testing.T) {
	t.Parallel()
	ended, cancel := context.WithCancelCause(context.Background())
	cause := errors.New("the caller gave up")
	cancel(cause)
	unconfirmed := Confirmed(ended, nil)
	cases := []struct {
		name string
		err  error
		want Outcome
	}{
		{"SuccessIsDone", nil, Done},
		{"NoRowIsDone", fmt.Errorf("scan: %w", pgx.ErrNoRows), Done},
		{"AServerErrorIsDone", server(SerializationFailure, ""), Done},
		{"NoConnectionIsNotSent", NotSentError(errors.New("pool closed")), NotSent},
		{"ALostReplyIsUnknown", errors.New("unexpected EOF"), Unknown},
		{"ASuccessAfterTheContextEndedIsUnknown", unconfirmed, Unknown},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := OutcomeOf(tc.err); got != tc.want {
				t.Errorf("OutcomeOf(%v) = %d, want %d", tc.err, got, tc.want)
			}
		})
	}
	t.Run("ConfirmedKeepsTheCauseOfTheContextsEnd", func(t *testing.T) {
		t.Parallel()
		if !errors.Is(unconfirmed, cause) {
			t.Errorf("Confirmed after the context ended = %v, which does not wrap %v", unconfirmed, cause)
		}
	})
	t.Run("OnlyASuccessAfterTheContextEndedIsAnswered", func(t *testing.T) {
		t.Parallel()
		if !Answered(fmt.Errorf("claim: %w", unconfirmed)) {
			t.Errorf("Answered(%v) = false", unconfirmed)
		}
		for _, tc := range cases {
			if tc.name != "ASuccessAfterTheContextEndedIsUnknown" && Answered(tc.err) {
				t.Errorf("Answered(%v) = true", tc.err)
			}
		}
	})
	t.Run("ConfirmedLeavesAnErrorOrALiveContextAlone", func(t *testing.T) {
		t.Parallel()
		err := &pgconn.PgError{Code: QueryCanceled}
		var got *pgconn.PgError
		if !errors.As(Confirmed(ended, err), &got) || got != err {
			t.Errorf("Confirmed(ended, %v) = %v", err, got)
		}
		if got := Confirmed(context.Background(), nil); got != nil {
			t.Errorf("Confirmed(live, nil) = %v", got)
		}
	})
}
