package keys

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		key, want string // want: a part of the error; "" for none
	}{
		{"job", ""},
		{"billing.invoice", ""},
		{"💥", ""},
		{strings.Repeat("k", MaxLen), ""},
		{"", "key is empty"},
		{strings.Repeat("k", MaxLen+1), "longer than the longest a key may be (1024)"},
		{"a\x00b", "NUL byte"},
		{"\xff", "not valid UTF-8"},
	} {
		err := Check(c.key)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("Check(%q) = %v, want nil", Short(c.key), err)
		case c.want != "" && (err == nil || !strings.Contains(err.Error(), c.want)):
			t.Errorf("Check(%q) = %v, want an error saying %q", Short(c.key), err, c.want)
		}
	}
}

func TestShort(t *testing.T) {
	t.Parallel()
	if got := Short("job"); got != "job" {
		t.Errorf("Short(job) = %q", got)
	}
	if got := Short(strings.Repeat("k", 100)); got != strings.Repeat("k", 64)+"..." {
		t.Errorf("Short of 100 bytes = %q, want its first 64 and ...", got)
	}
}

func TestLooksLikeFuncName(t *testing.T) {
	t.Parallel()
	for key, want := range map[string]bool{
		"github.com/acme/billing.sendInvoices":  true,
		"main.cleanup":                          true,
		"github.com/acme/jobs.(*Runner).Run-fm": true,
		"example.com/svc.main.func1":            true,
		"github.com/acme/jobs.Do[...]":          true,
		"billing.invoice":                       false,
		"nightly-report":                        false,
		"jobs.(*Runner).Run":                    true,
		"reports.daily.func2":                   true,
		"two words":                             false,
		"":                                      false,
		"github.com/acme/billing":               false,
	} {
		if got := LooksLikeFuncName(key); got != want {
			t.Errorf("LooksLikeFuncName(%q) = %v, want %v", key, got, want)
		}
	}
}
