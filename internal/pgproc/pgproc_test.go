package pgproc

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTail(t *testing.T) {
	require.Equal(t, "a\nb", Tail([]byte("a\nb\n")))
	long := strings.Repeat("line\n", 2000) + "last"
	got := Tail([]byte(long))
	require.True(t, strings.HasPrefix(got, "...\nline"))
	require.True(t, strings.HasSuffix(got, "\nlast"))
	require.Less(t, len(got), 4200)
}
