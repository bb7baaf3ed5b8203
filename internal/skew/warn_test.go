package skew

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"
)

func TestBound(t *testing.T) {
	t.Parallel()
	if got := Bound(0); got != time.Second {
		t.Errorf("Bound without min hold = %v, want 1s", got)
	}
	if got := Bound(3 * time.Second); got != 1500*time.Millisecond {
		t.Errorf("Bound(3s) = %v, want half of it", got)
	}
}

func TestWarn(t *testing.T) {
	t.Parallel()
	var out bytes.Buffer
	logger := slog.New(slog.NewTextHandler(&out, nil))
	reading := Sample{Offset: 2 * time.Second, Uncertainty: time.Millisecond}
	Warn(logger, "a", reading, false, false, time.Second, 0)
	if out.Len() != 0 {
		t.Fatalf("logged with no crossing: %s", out.String())
	}
	Warn(logger, "a", reading, true, false, time.Second, 0)
	if s := out.String(); !strings.Contains(s, "level=WARN") || !strings.Contains(s, "beyond the bound") || !strings.Contains(s, "skew=2s") {
		t.Fatalf("the crossing up: %s", s)
	}
	out.Reset()
	Warn(logger, "a", Sample{}, false, true, time.Second, 0)
	if s := out.String(); !strings.Contains(s, "level=INFO") || !strings.Contains(s, "back within the bound") {
		t.Fatalf("the crossing down: %s", s)
	}
}
