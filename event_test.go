package pglease_test

import (
	"bufio"
	"encoding/json"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// jsonLogger logs every level as JSON lines into buf.
func jsonLogger(buf *lockedBuffer) *slog.Logger {
	return slog.New(slog.NewJSONHandler(buf, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

// loggedLines parses the JSON lines of buf whose event is kind.
func loggedLines(t *testing.T, buf *lockedBuffer, kind pglease.EventKind) []map[string]any {
	t.Helper()
	var lines []map[string]any
	sc := bufio.NewScanner(strings.NewReader(buf.String()))
	for sc.Scan() {
		var line map[string]any
		require.NoError(t, json.Unmarshal(sc.Bytes(), &line), "%s", sc.Text())
		if line["event"] == kind.String() {
			lines = append(lines, line)
		}
	}
	require.NoError(t, sc.Err())
	return lines
}

// TestEventLog is about what the logger of WithLogger receives.
func TestEventLog(t *testing.T) {
	t.Parallel()

	t.Run("DurationsReadAsDurations", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		var logs lockedBuffer
		events := pgtest.NewEvents(t)
		l := pgtest.Locker(t, pool, table, "log", pglease.WithLogger(jsonLogger(&logs)), pglease.WithHook(events.Hook),
			pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		lease, err := l.Claim(ctx, "k")
		require.NoError(t, err)
		events.WaitFor(t, pglease.EventExtended, 5*time.Second)
		require.NoError(t, lease.Unlock(ctx))

		// The claim and the heartbeat report their round trips; the
		// release's end event reports none.
		for _, kind := range []pglease.EventKind{pglease.EventAcquired, pglease.EventExtended} {
			lines := loggedLines(t, &logs, kind)
			require.NotEmpty(t, lines, "no %s line in %s", kind, logs.String())
			for _, line := range lines {
				t.Logf("%s: took %v", kind, line["took"])
				took, ok := line["took"].(string)
				require.True(t, ok, "took is a duration string, not a count of nanoseconds: %v", line)
				d, err := time.ParseDuration(took)
				require.NoError(t, err)
				assert.Positive(t, d)
				assert.Less(t, d, 10*time.Second)
				assert.Equal(t, d.Round(time.Microsecond), d, "rounded to the microsecond: %s", took)
			}
		}
		require.Len(t, loggedLines(t, &logs, pglease.EventReleased), 1)
	})

	t.Run("LostLeaseLogsNoZeroRoundTrip", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		var logs lockedBuffer
		a := pgtest.Locker(t, pool, table, "a", pglease.WithLogger(jsonLogger(&logs)),
			pglease.WithTTL(time.Second), pglease.WithHeartbeatInterval(100*time.Millisecond))
		lease, err := a.Claim(ctx, "k")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, `UPDATE `+table+` SET holder = 'b', fence = fence + 1000`)
		require.NoError(t, err)
		pgtest.WaitDone(t, lease, 5*time.Second)
		lines := loggedLines(t, &logs, pglease.EventLost)
		require.Len(t, lines, 1)
		assert.NotContains(t, lines[0], "took", "a loss has no round trip to report")
		assert.Contains(t, lines[0]["error"], "row taken by a later lease (holder b, fence")
	})
}
