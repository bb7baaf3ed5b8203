package pgleaseui

import (
	"bytes"
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"time"

	"github.com/pglease/pglease"
)

//go:embed assets
var assets embed.FS

var page = template.Must(template.ParseFS(assets, "assets/page.html"))

// Option configures the page.
type Option func(*config)

type config struct {
	buttons bool
	perJob  int
	since   time.Duration
	skews   []*pglease.Locker
}

// WithAdminButtons shows a Revoke and a ForceExpire button beside every live
// lease, each asking for confirmation, and accepts the POSTs they send.
// Without it the page is read-only and the handler refuses every POST.
// Enable it only behind the service's own authentication.
func WithAdminButtons() Option { return func(c *config) { c.buttons = true } }

// WithRuns sets how many of each job's latest runs the page shows, started
// within since of the server's clock. The default is 30 runs within the
// last hour; n and since must be positive.
func WithRuns(n int, since time.Duration) Option {
	return func(c *config) { c.perJob, c.since = n, since }
}

// WithClockSkew shows, beside the holders of lockers (this process's
// Lockers on the table), each one's reading of its clock's skew against the
// database's (Locker.ClockSkew): only a replica knows its own.
func WithClockSkew(lockers ...*pglease.Locker) Option {
	return func(c *config) { c.skews = append(c.skews, lockers...) }
}

// Handler returns the page of admin's table: GET serves it (and its style
// and script under static/), and, with WithAdminButtons, POST revoke and
// force-expire act on the key of their form. Mount it under a prefix with
// http.StripPrefix. It panics on a nil admin or a WithRuns out of range.
func Handler(admin *pglease.Admin, opts ...Option) http.Handler {
	c := config{perJob: 30, since: time.Hour}
	for _, o := range opts {
		o(&c)
	}
	if admin == nil {
		panic("pgleaseui: Handler: nil *pglease.Admin")
	}
	if c.perJob <= 0 || c.since <= 0 {
		panic(fmt.Sprintf("pgleaseui: WithRuns(%d, %v): both must be positive", c.perJob, c.since))
	}
	static, err := fs.Sub(assets, "assets/static")
	if err != nil {
		panic(err)
	}
	h := &handler{admin: admin, config: c}
	mux := http.NewServeMux()
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)))
	mux.HandleFunc("GET /{$}", h.page)
	mux.HandleFunc("POST /revoke", h.act("revoked", admin.Revoke))
	mux.HandleFunc("POST /force-expire", h.act("force-expired", admin.ForceExpire))
	// A handler mounted with http.StripPrefix("/pglease/") gets "" for the
	// page itself.
	return http.NewCrossOriginProtection().Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "" {
			r.URL.Path = "/"
		}
		mux.ServeHTTP(w, r)
	}))
}

type handler struct {
	admin *pglease.Admin
	config
}

// page serves the whole page, or with ?part=fleet only what the script
// swaps in on each refresh.
func (h *handler) page(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	listed, err := h.admin.List(ctx)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	runs, runsErr := h.admin.Runs(ctx, "", h.since)
	v := build(listed, runs, h.perJob)
	if runsErr != nil { // a table without ledger (WithoutFenceColumn) still shows its keys
		v.RunsErr = runsErr.Error()
	}
	v.Since, v.Buttons, v.Done = short(h.since), h.buttons, r.URL.Query().Get("done")
	v.addSkews(h.skews)
	name := "page"
	if r.URL.Query().Get("part") == "fleet" {
		name = "fleet"
	}
	var buf bytes.Buffer
	if err := page.ExecuteTemplate(&buf, name, v); err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = w.Write(buf.Bytes())
}

// act serves the POST of a button: without WithAdminButtons it is refused;
// with it, f acts on the form's key and the browser goes back to the page,
// which says what was done.
func (h *handler) act(did string, f func(ctx context.Context, key string) (pglease.Revocation, error)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		if !h.buttons {
			http.Error(w, "pgleaseui: the page is read-only (WithAdminButtons enables Revoke and ForceExpire)", http.StatusForbidden)
			return
		}
		key := r.PostFormValue("key")
		if key == "" {
			http.Error(w, "pgleaseui: no key in the form", http.StatusBadRequest)
			return
		}
		rev, err := f(r.Context(), key)
		switch {
		case errors.Is(err, pglease.ErrNotFound):
			http.Error(w, err.Error(), http.StatusNotFound)
			return
		case err != nil:
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		msg := key + " " + did
		if !rev.Changed {
			msg = key + " left as it was: not live, or revoked already"
		}
		// Relative to the request's own URL, whatever prefix the page is
		// mounted under (http.Redirect would resolve it against the path
		// http.StripPrefix left).
		w.Header().Set("Location", "./?done="+url.QueryEscape(msg))
		w.WriteHeader(http.StatusSeeOther)
	}
}
