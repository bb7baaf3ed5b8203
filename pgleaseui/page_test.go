package pgleaseui_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/chromedp"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseui"
)

// screenshots asks TestPage to write its screenshots to docs/ui/ (also
// PGLEASE_UI_SCREENSHOTS=1); without it nothing is written.
var screenshots = flag.Bool("screenshots", false, "write the page's screenshots to docs/ui/")

// chromium is Debian's browser, which .ci/run installs: the tests fail
// without it.
func chromium(t *testing.T) string {
	t.Helper()
	for _, p := range []string{"/usr/bin/chromium", "/usr/bin/chromium-browser"} {
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	p, err := exec.LookPath("chromium")
	require.NoError(t, err, "the browser tests need chromium: apt-get install chromium (.ci/run installs it)")
	return p
}

// browser starts one headless chromium for the test, closed at cleanup.
func browser(t *testing.T) context.Context {
	t.Helper()
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(chromium(t)),
		chromedp.NoSandbox, // root in a container
		chromedp.Headless,
		chromedp.DisableGPU,
		chromedp.WindowSize(1280, 900),
	)
	alloc, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(alloc)
	t.Cleanup(func() { cancel(); cancelAlloc() })
	require.NoError(t, chromedp.Do(ctx), "starting chromium")
	return ctx
}

// tab is a page of the browser, with what its console reported: calls of
// the console API, uncaught exceptions and the browser's log.
type tab struct {
	ctx      context.Context
	mu       sync.Mutex
	messages []string
}

// newTab opens a tab of b for one subtest, with 60 s for all it does.
func newTab(b context.Context, t *testing.T) *tab {
	t.Helper()
	ctx, cancel := chromedp.NewContext(b)
	require.NoError(t, chromedp.Do(ctx), "opening a tab") // before any timeout: see chromedp.Run
	tb := &tab{ctx: ctx}
	var wg sync.WaitGroup
	console := chromedp.Console(ctx)
	wg.Go(func() {
		for m, err := range console {
			if err != nil {
				return
			}
			switch m.Type {
			case chromedp.ConsoleLog, "info", "debug":
				continue
			}
			tb.mu.Lock()
			tb.messages = append(tb.messages, m.String()+" at "+m.URL)
			tb.mu.Unlock()
		}
	})
	timed, cancelTimeout := context.WithTimeout(ctx, 60*time.Second)
	tb.ctx = timed
	t.Cleanup(func() { cancelTimeout(); cancel(); wg.Wait() })
	return tb
}

// reported is what the console reported beyond logs and infos.
func (tb *tab) reported() []string {
	tb.mu.Lock()
	defer tb.mu.Unlock()
	return append([]string(nil), tb.messages...)
}

func (tb *tab) do(t *testing.T, steps ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	require.NoError(t, chromedp.Do(tb.ctx, steps...))
}

// until polls expr in the page until it is true, for at most 20 s. An
// error (the page navigating away while it is evaluated) is polled past.
func (tb *tab) until(t *testing.T, what, expr string) {
	t.Helper()
	var last error
	require.Eventually(t, func() bool {
		var ok bool
		ok, last = chromedp.Run(tb.ctx, chromedp.Evaluate[bool](expr))
		return last == nil && ok
	}, 20*time.Second, 50*time.Millisecond, "waiting for %s: %s (last error: %v)", what, expr, &last)
}

// eval evaluates expr in tb's page.
func eval[T any](t *testing.T, tb *tab, expr string) T {
	t.Helper()
	v, err := chromedp.Run(tb.ctx, chromedp.Evaluate[T](expr, chromedp.EvalAwaitPromise))
	require.NoError(t, err, "evaluating %s", expr)
	return v
}

// serve mounts h under /pglease/ and returns the page's address.
func serve(t *testing.T, h http.Handler) string {
	t.Helper()
	return mounted(t, h).URL + "/pglease/"
}

// fleet is a table as a fleet of replicas leaves it: a job of ticks run in
// turn by three replicas, with ticks skipped; a job whose run was killed
// and lapsed; a live lease of a plain key, a released one and a revoked
// one.
type fleet struct {
	ctx      context.Context
	pool     *pgxpool.Pool
	table    string
	admin    *pglease.Admin
	replicas []*pglease.Locker
	killed   *pglease.Lease
}

// runTick claims the current tick of job with j, waiting up to 5 s for one
// not yet taken, and releases it after took.
func runTick(ctx context.Context, t *testing.T, j *pglease.JobLocker, key string, took time.Duration) {
	t.Helper()
	var lease *pglease.Lease
	require.Eventually(t, func() bool {
		var err error
		lease, err = j.Claim(ctx, key)
		if err != nil && !errors.Is(err, pglease.ErrHeld) {
			t.Fatalf("claiming a tick of %s: %v", key, err)
		}
		return err == nil
	}, 5*time.Second, 20*time.Millisecond, "a tick of %s", key)
	time.Sleep(took) // the job's work
	require.NoError(t, lease.Unlock(ctx))
}

func newFleet(t *testing.T) *fleet {
	t.Helper()
	ctx, pool, table := pgtest.Setup(t)
	f := &fleet{ctx: ctx, pool: pool, table: table}
	var err error
	f.admin, err = pglease.NewAdmin(pool, pglease.WithTable(table))
	require.NoError(t, err)
	for _, name := range []string{"billing-7f9c", "billing-2d41", "billing-a803"} {
		f.replicas = append(f.replicas, pgtest.Locker(t, pool, table, name))
	}

	// A replica killed mid-run: its heartbeats and release never reach
	// the server again, and its run lapses after its TTL.
	killedDB := pgtest.NewFaultyDB(pgtest.Pool(t, nil))
	nightly, err := pgtest.Locker(t, killedDB, table, "billing-dead", pglease.WithTTL(time.Second)).Job(pglease.WithPeriod(time.Hour))
	require.NoError(t, err)
	f.killed, err = nightly.Claim(ctx, "nightly-report")
	require.NoError(t, err)
	killedDB.Cut(errors.New("killed"))

	invoices := make([]*pglease.JobLocker, len(f.replicas))
	for i, r := range f.replicas {
		invoices[i], err = r.Job(pglease.WithPeriod(time.Second))
		require.NoError(t, err)
	}
	for i := range 3 {
		runTick(ctx, t, invoices[i%3], "send-invoices", 50*time.Millisecond)
	}
	time.Sleep(2 * time.Second) // two ticks with no run: a gap
	runTick(ctx, t, invoices[1], "send-invoices", 120*time.Millisecond)

	_, err = f.replicas[0].Claim(ctx, "leader")
	require.NoError(t, err)
	released, err := f.replicas[1].Claim(ctx, "rebuild-index")
	require.NoError(t, err)
	require.NoError(t, released.Unlock(ctx))
	_, err = f.replicas[2].Claim(ctx, "purge-sessions")
	require.NoError(t, err)
	_, err = f.admin.Revoke(ctx, "purge-sessions")
	require.NoError(t, err)
	pgtest.WaitExpired(t, pool, table, "nightly-report", 10*time.Second)
	return f
}

// noOverflow is true when the page is no wider than the window.
const noOverflow = `document.documentElement.scrollWidth <= window.innerWidth`

// TestPage drives the page in a real browser (Debian's chromium, headless)
// against a real table that real Lockers use.
func TestPage(t *testing.T) {
	t.Parallel()
	b := browser(t)

	t.Run("LoadsWithNoConsoleError", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		tb := newTab(b, t)
		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(f.admin, pgleaseui.WithAdminButtons()))),
			chromedp.WaitVisible(chromedp.CSS(`#keys`)))
		tb.until(t, "two refreshes", `Number(document.getElementById("fleet").dataset.refreshes) >= 2`)
		assert.Empty(t, tb.reported(), "the console and the browser's log")
	})

	t.Run("ShowsTheKeysAndRunsOfTheFleet", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		tb := newTab(b, t)
		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(f.admin))), chromedp.WaitVisible(chromedp.CSS(`#keys`)))
		states := eval[map[string]string](t, tb, `Object.fromEntries([...document.querySelectorAll("#keys tbody tr")].map(r => [r.dataset.key, r.querySelector(".badge").textContent]))`)
		assert.Equal(t, map[string]string{
			"leader": "live", "rebuild-index": "released", "purge-sessions": "revoked",
			"nightly-report": "lapsed", "send-invoices": "released",
		}, states)
		holders := eval[[]string](t, tb, `[...document.querySelectorAll("#holders tbody tr")].map(r => r.dataset.holder)`)
		for _, r := range f.replicas {
			assert.Contains(t, holders, r.Holder(), "every replica that ran or holds something")
		}
		leaderOf := eval[string](t, tb, `document.querySelector('#holders tr[data-holder="`+f.replicas[0].Holder()+`"] td:nth-child(2)').textContent`)
		assert.Equal(t, "leader", leaderOf, "a replica with its live lease")

		runs := eval[[]string](t, tb, `[...document.querySelectorAll('article[data-job="send-invoices"] .timeline li')].map(li => li.className + ": " + li.textContent)`)
		require.GreaterOrEqual(t, len(runs), 5, "four runs and a gap at least: %q", runs)
		completed := 0
		for _, r := range runs {
			if !strings.HasPrefix(r, "gap") {
				assert.Regexp(t, `^run outcome-completed: \d\d:\d\d:\d\dbilling-[0-9a-f]{4}#[0-9a-f]+completed$`, r)
				completed++
			}
		}
		assert.Equal(t, 4, completed)
		assert.Regexp(t, `^gap: gap: [1-9] skipped$`, runs[len(runs)-2], "the ticks with no run before the last")
		period := eval[string](t, tb, `document.querySelector('article[data-job="send-invoices"] h3 small').textContent`)
		assert.Equal(t, "every 1s", period)

		if *screenshots || os.Getenv("PGLEASE_UI_SCREENSHOTS") == "1" {
			tb.do(t, chromedp.Click(chromedp.CSS(`article[data-job="send-invoices"] summary`)))
			shoot(t, tb, "page-wide.png", 1280, 900)
			shoot(t, tb, "page-narrow.png", 375, 800)
		}
	})

	t.Run("UpdatesWhenALeaseChangesHands", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		a := pgtest.Locker(t, pool, table, "replica-a")
		bb := pgtest.Locker(t, pool, table, "replica-b")
		first, err := a.Claim(ctx, "leader")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		tb := newTab(b, t)
		holderIs := func(h string) string {
			return `document.querySelector('#keys tr[data-key="leader"] td:nth-child(2)')?.textContent === "` + h + `"`
		}
		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(admin))))
		tb.until(t, "replica-a holds it", holderIs(a.Holder()))
		eval[int](t, tb, `window.__mark = 42`)

		require.NoError(t, first.Unlock(ctx))
		second := pgtest.TakeOver(ctx, t, bb, "leader", first, 10*time.Second)
		tb.until(t, "replica-b holds it, with its fence", holderIs(bb.Holder())+
			` && document.querySelector('#keys tr[data-key="leader"] td:nth-child(3)').textContent === "`+fmt.Sprint(second.Fence())+`"`)
		mark := eval[int](t, tb, `window.__mark`)
		assert.Equal(t, 42, mark, "updated without a reload")
	})

	t.Run("MarksAKilledRunAsLapsed", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		tb := newTab(b, t)
		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(f.admin))), chromedp.WaitVisible(chromedp.CSS(`#keys`)))
		run := eval[struct {
			Class  string `json:"class"`
			Text   string `json:"text"`
			Border string `json:"border"`
		}](t, tb, `(() => { const li = document.querySelector('article[data-job="nightly-report"] .timeline li');
			return {class: li.className, text: li.textContent, border: getComputedStyle(li).borderTopStyle}; })()`)
		assert.Equal(t, "run outcome-lapsed", run.Class)
		assert.Contains(t, run.Text, "lapsed", "said in a word")
		assert.Contains(t, run.Text, "billing-dead", "and where it ran")
		assert.Equal(t, "dashed", run.Border, "and not by colour alone")
		badge := eval[string](t, tb, `document.querySelector('article[data-job="nightly-report"] h3 .badge.outcome-lapsed').textContent`)
		assert.Equal(t, "1 lapsed", badge)
		revoked := eval[string](t, tb, `document.querySelector('#keys tr[data-key="purge-sessions"]').className`)
		assert.Equal(t, "state-revoked", revoked, "a revoked lease stands out too")
	})

	t.Run("AdminButtonsAbsentUnlessEnabled", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		_, err := pgtest.Locker(t, pool, table, "replica-a").Claim(ctx, "leader")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		tb := newTab(b, t)

		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(admin))), chromedp.WaitVisible(chromedp.CSS(`#keys`)))
		buttons := eval[int](t, tb, `document.querySelectorAll("button, form").length`)
		assert.Zero(t, buttons, "read-only by default")
		status := eval[int](t, tb, `fetch("revoke", {method: "POST", body: new URLSearchParams({key: "leader"})}).then(r => r.status)`)
		assert.Equal(t, http.StatusForbidden, status, "and its POST refused")

		// The confirmations the page asks, answered by accept.
		var asked sync.Map
		var accept atomic.Bool
		dctx, stop := context.WithCancel(tb.ctx)
		dialogs := chromedp.Events(dctx, page.JavascriptDialogOpening)
		var wg sync.WaitGroup
		t.Cleanup(func() { stop(); wg.Wait() })
		wg.Go(func() {
			for d, err := range dialogs {
				if err != nil {
					return
				}
				asked.Store(d.Message, true)
				_, _ = chromedp.Call(tb.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{Accept: accept.Load()})
			}
		})
		tb.do(t, chromedp.Navigate(serve(t, pgleaseui.Handler(admin, pgleaseui.WithAdminButtons()))),
			chromedp.WaitVisible(chromedp.CSS(`#keys tr[data-key="leader"] button.revoke`)))
		buttons = eval[int](t, tb, `document.querySelectorAll("#keys button").length`)
		assert.Equal(t, 2, buttons, "Revoke and ForceExpire")

		tb.do(t, chromedp.Click(chromedp.CSS(`#keys tr[data-key="leader"] button.revoke`)))
		require.Eventually(t, func() bool { _, ok := asked.Load(confirmRevoke); return ok }, 10*time.Second, 10*time.Millisecond, "asks before it revokes")
		tb.until(t, "the dismissed dialog left the page", `document.querySelector('#keys tr[data-key="leader"]').className === "state-live"`)
		row, _ := pgtest.ReadRow(t, pool, table, "leader")
		assert.NotEqual(t, "pglease:revoked", row.Holder, "dismissed: nothing done")

		accept.Store(true)
		tb.do(t, chromedp.Click(chromedp.CSS(`#keys tr[data-key="leader"] button.revoke`)))
		tb.until(t, "the page says it revoked", `document.querySelector(".done")?.textContent === "leader revoked"`)
		tb.until(t, "and shows it revoked", `document.querySelector('#keys tr[data-key="leader"]').className === "state-revoked"`)
		row, _ = pgtest.ReadRow(t, pool, table, "leader")
		assert.Equal(t, "pglease:revoked", row.Holder, "accepted: revoked")
	})

	t.Run("WorksInANarrowWindow", func(t *testing.T) {
		t.Parallel()
		f := newFleet(t)
		tb := newTab(b, t)
		tb.do(t, chromedp.EmulateViewport(375, 800, chromedp.EmulateMobile),
			chromedp.Navigate(serve(t, pgleaseui.Handler(f.admin, pgleaseui.WithAdminButtons()))),
			chromedp.WaitVisible(chromedp.CSS(`#keys`)))
		width := eval[int](t, tb, `window.innerWidth`)
		require.Equal(t, 375, width)
		fits := eval[bool](t, tb, noOverflow)
		scroll := eval[int](t, tb, `document.documentElement.scrollWidth`)
		assert.True(t, fits, "no horizontal overflow of the page: %d wide in %d", scroll, width)
		outside := eval[[]string](t, tb, `[...document.querySelectorAll("td, .timeline li")].filter(e => e.getBoundingClientRect().right > window.innerWidth).map(e => e.textContent)`)
		assert.Empty(t, outside, "every cell and run within the window: the tables stack")
		stacked := eval[string](t, tb, `getComputedStyle(document.querySelector("#keys tbody tr")).display`)
		assert.Equal(t, "block", stacked, "each row a card")
	})
}

// confirmRevoke is the question the Revoke button of "leader" asks.
const confirmRevoke = "Revoke the lease on leader? Its holder loses it at its next heartbeat; nobody can claim it before it would have expired."

// shoot writes a full-page screenshot of tb at width x height to docs/ui/name.
func shoot(t *testing.T, tb *tab, name string, width, height int64) {
	t.Helper()
	tb.do(t, chromedp.EmulateViewport(width, height))
	eval[any](t, tb, `new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))`) // laid out anew
	png, err := chromedp.Run(tb.ctx, chromedp.FullScreenshot(100))                                    // 100: PNG
	require.NoError(t, err)
	dir := filepath.Join("..", "docs", "ui")
	require.NoError(t, os.MkdirAll(dir, 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, name), png, 0o644))
	t.Logf("wrote %s", filepath.Join(dir, name))
}
