package pgleaseui_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/pglease/pglease"
	"github.com/pglease/pglease/internal/pgtest"
	"github.com/pglease/pglease/pgleaseui"
)

// mountPage serves the page of the lease table under /pglease/ of the
// service's mux, behind whatever authentication the mux already has.
func mountPage(mux *http.ServeMux, pool *pgxpool.Pool) error {
	admin, err := pglease.NewAdmin(pool) // pglease.WithTable for another table
	if err != nil {
		return err
	}
	mux.Handle("/pglease/", http.StripPrefix("/pglease", pgleaseui.Handler(admin)))
	return nil
}

// Mount the page in a service, as pprof or expvar would be.
func ExampleHandler() {
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, pgtest.Server.DSN())
	if err != nil {
		panic(err)
	}
	defer pool.Close()
	if err := pglease.Migrate(ctx, pool); err != nil {
		panic(err)
	}
	locker := pglease.NewLocker(pool, pglease.WithHolder("replica-a"))
	defer locker.Close(ctx)
	if _, err := locker.Claim(ctx, "example-nightly"); err != nil {
		panic(err)
	}

	mux := http.NewServeMux()
	if err := mountPage(mux, pool); err != nil {
		panic(err)
	}
	srv := httptest.NewServer(mux)
	defer srv.Close()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/pglease/", nil)
	if err != nil {
		panic(err)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		panic(err)
	}
	defer resp.Body.Close()
	page, err := io.ReadAll(resp.Body)
	if err != nil {
		panic(err)
	}
	fmt.Println(resp.Status)
	fmt.Println(strings.Contains(string(page), `<tr class="state-live" data-key="example-nightly">`))
	// Output:
	// 200 OK
	// true
}
