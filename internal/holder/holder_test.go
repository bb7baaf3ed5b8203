package holder

import (
	"fmt"
	"os"
	"regexp"
	"strings"
	"testing"
)

func TestHolder(t *testing.T) {
	t.Parallel()
	t.Run("DefaultIsHostAndProcess", func(t *testing.T) {
		t.Parallel()
		if got, suffix := Default(), fmt.Sprintf("-%d", os.Getpid()); !strings.HasSuffix(got, suffix) || len(got) == len(suffix) {
			t.Errorf("Default() = %q, want a host name and %q", got, suffix)
		}
	})
	t.Run("OwnAddsSixteenHexDigitsOfItsOwn", func(t *testing.T) {
		t.Parallel()
		form := regexp.MustCompile(`^replica#[0-9a-f]{16}$`)
		a, b := Own("replica"), Own("replica")
		if !form.MatchString(a) || !form.MatchString(b) {
			t.Errorf("Own(%q) = %q, %q: want replica#<16 hex digits>", "replica", a, b)
		}
		if a == b {
			t.Errorf("two holders of one name are the same: %q", a)
		}
	})
}
