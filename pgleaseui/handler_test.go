package pgleaseui_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseui"
)

// get fetches path of srv and returns its status and body.
func get(t *testing.T, srv *httptest.Server, path string) (int, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(pgtest.Ctx(t), http.MethodGet, srv.URL+path, nil)
	require.NoError(t, err)
	resp, err := srv.Client().Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return resp.StatusCode, string(body)
}

// post sends a button's form for key to path of srv, with the headers a
// browser sends on a same-origin form, and returns the response, its body
// read: its status and Location header.
func post(t *testing.T, srv *httptest.Server, path, key string, header http.Header) (posted, string) {
	t.Helper()
	req, err := http.NewRequestWithContext(pgtest.Ctx(t), http.MethodPost, srv.URL+path, strings.NewReader(url.Values{"key": {key}}.Encode()))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	req.Header.Set("Sec-Fetch-Site", "same-origin")
	for k, v := range header {
		req.Header[k] = v
	}
	client := *srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	resp, err := client.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return posted{resp.StatusCode, resp.Header.Get("Location")}, string(body)
}

// posted is what post got back.
type posted struct {
	StatusCode int
	Location   string
}

// mounted serves h under /pglease/, as README shows.
func mounted(t *testing.T, h http.Handler) *httptest.Server {
	t.Helper()
	mux := http.NewServeMux()
	mux.Handle("/pglease/", http.StripPrefix("/pglease", h))
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv
}

// TestHandler pins the page served without a browser: what it shows of a
// table, and that its buttons act only when enabled.
func TestHandler(t *testing.T) {
	t.Parallel()

	// Only a replica knows its own clock's skew: the page shows the
	// readings of the Lockers it is given, beside their holders, and no
	// skew column without them.
	t.Run("ShowsTheClockSkewOfItsOwnLockers", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		claimed, idle := pgtest.Locker(t, pool, table, "replica-a"), pgtest.Locker(t, pool, table, "replica-b")
		lease, err := claimed.Claim(ctx, "k")
		require.NoError(t, err)
		skew, ok := claimed.ClockSkew()
		require.True(t, ok, "a claim gives a reading")
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)

		_, body := get(t, mounted(t, pgleaseui.Handler(admin, pgleaseui.WithClockSkew(claimed, idle))), "/pglease/?part=fleet")
		assert.Regexp(t, `<tr data-holder="`+regexp.QuoteMeta(claimed.Holder())+`">.*<td class="skew" data-label="Clock skew">(&#43;|-)?[0-9.]+(s|ms|µs) ± [0-9.]+(s|ms|µs)</td></tr>`, body,
			"the claimer's reading (%+v)", skew)
		assert.Regexp(t, `<tr data-holder="`+regexp.QuoteMeta(idle.Holder())+`">.*<td class="skew" data-label="Clock skew">no reading yet</td></tr>`, body,
			"a Locker with no reading, listed though it holds nothing")
		_, plain := get(t, mounted(t, pgleaseui.Handler(admin)), "/pglease/?part=fleet")
		assert.NotContains(t, plain, "Clock skew")
		require.NoError(t, lease.Unlock(ctx))
	})

	t.Run("ShowsEveryKeyWithItsStateAndEveryHolder", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		locker := pgtest.Locker(t, pool, table, "replica-a")
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		live, err := locker.Claim(ctx, "live-key")
		require.NoError(t, err)
		released, err := locker.Claim(ctx, "released-key")
		require.NoError(t, err)
		require.NoError(t, released.Unlock(ctx))
		_, err = locker.Claim(ctx, "revoked-key")
		require.NoError(t, err)
		_, err = admin.Revoke(ctx, "revoked-key")
		require.NoError(t, err)
		_, err = locker.Claim(ctx, "lapsed-key")
		require.NoError(t, err)
		_, err = admin.ForceExpire(ctx, "lapsed-key") // expired without a release
		require.NoError(t, err)

		srv := mounted(t, pgleaseui.Handler(admin))
		for _, path := range []string{"/pglease/", "/pglease/?part=fleet"} {
			code, body := get(t, srv, path)
			require.Equal(t, http.StatusOK, code, body)
			for key, state := range map[string]string{"live-key": "live", "released-key": "released", "revoked-key": "revoked", "lapsed-key": "lapsed"} {
				assert.Regexp(t, `<tr class="state-`+state+`" data-key="`+key+`">`, body, "%s: %s is %s", path, key, state)
			}
			assert.Contains(t, body, `<td class="num" data-label="Fence">`+strconv.FormatInt(live.Fence(), 10)+`</td>`, "the live lease's fence")
			assert.Contains(t, body, `<tr data-holder="`+locker.Holder()+`"><td data-label="Holder">`+locker.Holder()+`</td><td data-label="Live leases">live-key</td>`, "the holder with its live lease")
			assert.NotContains(t, body, "<form", "read-only: no button")
		}
		_, body := get(t, srv, "/pglease/?part=fleet")
		assert.NotContains(t, body, "<html", "the part the script swaps in is the fleet alone")
	})

	t.Run("ServesItsStyleAndScriptUnderItsPrefix", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		srv := mounted(t, pgleaseui.Handler(admin))
		code, page := get(t, srv, "/pglease/")
		require.Equal(t, http.StatusOK, code)
		for _, path := range []string{"static/ui.css", "static/ui.js"} {
			assert.Contains(t, page, `"`+path+`"`, "linked relative to the page, whatever its prefix")
			code, body := get(t, srv, "/pglease/"+path)
			assert.Equal(t, http.StatusOK, code, path)
			assert.NotEmpty(t, body, path)
		}
		assert.NotContains(t, page, "http://", "nothing from elsewhere: the page works offline")
		assert.NotContains(t, page, "https://")
		code, _ = get(t, srv, "/pglease/static/page.html")
		assert.Equal(t, http.StatusNotFound, code, "the template is not served")
	})

	t.Run("RefusesEveryPostWhenReadOnly", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		locker := pgtest.Locker(t, pool, table, "a")
		lease, err := locker.Claim(ctx, "job")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		srv := mounted(t, pgleaseui.Handler(admin))
		for _, path := range []string{"/pglease/revoke", "/pglease/force-expire"} {
			resp, body := post(t, srv, path, "job", nil)
			assert.Equal(t, http.StatusForbidden, resp.StatusCode, "%s: %s", path, body)
			assert.Contains(t, body, "read-only")
		}
		row, ok := pgtest.ReadRow(t, pool, table, "job")
		require.True(t, ok)
		assert.Equal(t, locker.Holder(), row.Holder, "nothing changed")
		assert.Equal(t, lease.Fence(), row.Fence)
		select {
		case <-lease.Done():
			t.Fatal("the lease was lost")
		default:
		}
	})

	t.Run("ButtonsActWhenEnabled", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		locker := pgtest.Locker(t, pool, table, "a")
		_, err := locker.Claim(ctx, "to-revoke")
		require.NoError(t, err)
		_, err = locker.Claim(ctx, "to-expire")
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		srv := mounted(t, pgleaseui.Handler(admin, pgleaseui.WithAdminButtons()))
		_, page := get(t, srv, "/pglease/")
		assert.Contains(t, page, `action="revoke"`)
		assert.Contains(t, page, `action="force-expire"`)
		assert.Contains(t, page, `data-confirm="Revoke the lease on to-revoke?`, "each asks for confirmation")

		resp, body := post(t, srv, "/pglease/revoke", "to-revoke", nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		assert.Equal(t, "./?done=to-revoke+revoked", resp.Location, "back to the page under its prefix")
		row, _ := pgtest.ReadRow(t, pool, table, "to-revoke")
		assert.Equal(t, "pglease:revoked", row.Holder)

		resp, body = post(t, srv, "/pglease/force-expire", "to-expire", nil)
		require.Equal(t, http.StatusSeeOther, resp.StatusCode, body)
		listed, err := admin.List(ctx)
		require.NoError(t, err)
		for _, l := range listed {
			if l.Key == "to-expire" {
				assert.False(t, l.Live, "expired at once")
			}
		}

		resp, _ = post(t, srv, "/pglease/revoke", "no-such-key", nil)
		assert.Equal(t, http.StatusNotFound, resp.StatusCode)
		resp, body = post(t, srv, "/pglease/revoke", "to-expire", http.Header{"Sec-Fetch-Site": {"cross-site"}})
		assert.Equal(t, http.StatusForbidden, resp.StatusCode, "a cross-origin POST is refused: %s", body)
	})

	t.Run("ShowsTheKeysOfATableWithoutLedger", func(t *testing.T) {
		t.Parallel()
		ctx, pool, table := pgtest.Setup(t)
		_, err := pgtest.Locker(t, pool, table, "a").Claim(ctx, "job")
		require.NoError(t, err)
		_, err = pool.Exec(ctx, "DROP TABLE "+pgx.Identifier{table + "_run"}.Sanitize())
		require.NoError(t, err)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		code, body := get(t, mounted(t, pgleaseui.Handler(admin)), "/pglease/")
		require.Equal(t, http.StatusOK, code, body)
		assert.Contains(t, body, `data-key="job"`)
		assert.Contains(t, body, `<p class="error">No runs: `, "and says why it shows no run")
	})

	t.Run("RefusesANilAdminAndRunsOutOfRange", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table))
		require.NoError(t, err)
		assert.PanicsWithValue(t, "pgleaseui: Handler: nil *pglease.Admin", func() { pgleaseui.Handler(nil) })
		assert.PanicsWithValue(t, "pgleaseui: WithRuns(0, 1h0m0s): both must be positive", func() { pgleaseui.Handler(admin, pgleaseui.WithRuns(0, time.Hour)) })
		assert.PanicsWithValue(t, "pgleaseui: WithRuns(5, 0s): both must be positive", func() { pgleaseui.Handler(admin, pgleaseui.WithRuns(5, 0)) })
	})

	t.Run("NamesAMissingTable", func(t *testing.T) {
		t.Parallel()
		_, pool, table := pgtest.Setup(t)
		admin, err := pglease.NewAdmin(pool, pglease.WithTable(table+"_other"))
		require.NoError(t, err)
		code, body := get(t, mounted(t, pgleaseui.Handler(admin)), "/pglease/")
		assert.Equal(t, http.StatusInternalServerError, code)
		assert.Contains(t, body, table+"_other")
	})
}
