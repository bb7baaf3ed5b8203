package main

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"regexp"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
)

// lockedBuffer is an output the command writes while the test reads it.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestUI pins `pglease ui`: the page of pgleaseui served on -addr.
func TestUI(t *testing.T) {
	t.Parallel()

	t.Run("ServesThePageOfTheTableUntilInterrupted", func(t *testing.T) {
		t.Parallel()
		ctx := pgtest.Ctx(t)
		table := migrated(t)
		job, err := pgtest.Locker(t, pgtest.Pool(t, nil), table, "replica-a").Job(pglease.WithPeriod(time.Hour))
		require.NoError(t, err)
		lease, err := job.Claim(ctx, "hourly")
		require.NoError(t, err)

		serveCtx, interrupt := context.WithCancel(ctx)
		var out, errOut lockedBuffer
		code := make(chan int, 1)
		go func() {
			// -timeout bounds each reading, not the command: it serves past it.
			code <- run(serveCtx, []string{"ui", "-dsn", pgtest.Server.DSN(), "-table", table, "-addr", "127.0.0.1:0", "-timeout", "2s"}, &out, &errOut)
		}()
		addr := regexp.MustCompile(`http://[0-9.:]+/`)
		require.Eventually(t, func() bool { return addr.MatchString(out.String()) }, 10*time.Second, 10*time.Millisecond, "stderr: %s", errOut.String())
		url := addr.FindString(out.String())
		fetch := func() string {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
			require.NoError(t, err)
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			body, err := io.ReadAll(resp.Body)
			require.NoError(t, err)
			require.Equal(t, http.StatusOK, resp.StatusCode, string(body))
			return string(body)
		}
		body := fetch()
		assert.Contains(t, body, `<tr class="state-live" data-key="hourly">`)
		assert.Contains(t, body, `<article class="job" data-job="hourly">`, "and its run")
		assert.NotContains(t, body, "<form", "read-only without -buttons")
		require.NoError(t, lease.Unlock(ctx))
		time.Sleep(2100 * time.Millisecond) // past -timeout
		assert.Contains(t, fetch(), `<tr class="state-released" data-key="hourly">`, "still served past -timeout, read afresh")

		interrupt()
		select {
		case c := <-code:
			assert.Equal(t, exitOK, c, "stderr: %s", errOut.String())
		case <-time.After(10 * time.Second):
			t.Fatal("still serving 10s after the interrupt")
		}
	})

	t.Run("MissingTableExitsOneBeforeServing", func(t *testing.T) {
		t.Parallel()
		table := pgtest.TableName()
		r := runCmd(t, "ui", "-dsn", pgtest.Server.DSN(), "-table", table, "-addr", "127.0.0.1:0")
		assert.Equal(t, exitFail, r.code)
		assert.Contains(t, r.stderr, "pglease migrate -table "+table)
		assert.NotContains(t, r.stdout, "http://")
	})
}
