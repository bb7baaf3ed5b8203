// Package pgleaseui is a web page of a pglease lease table: every key with
// its holder, fence, time left and state, the holders (replicas) with their
// leases, and for each job with ticks its recent runs as a timeline from the
// ledger, with the gaps between ticks and any tick run twice made visible.
// The page refreshes itself every second and a half without a reload. Every
// time it shows is the database server's, as Admin.List and Admin.Runs read
// it; it needs SELECT on the table and its ledger.
//
// Mount it in a service as pprof or expvar would be:
//
//	admin, err := pglease.NewAdmin(pool)
//	// ...
//	mux.Handle("/pglease/", http.StripPrefix("/pglease", pgleaseui.Handler(admin)))
//
// or run `pglease ui`, which serves the same page.
//
// The page is read-only unless WithAdminButtons enables the Revoke and
// ForceExpire buttons (each asks for confirmation, and needs UPDATE on the
// table). The handler has no authentication of its own: put it behind the
// service's own, as for pprof, and enable the buttons only there. It
// refuses cross-origin POSTs (http.CrossOriginProtection).
package pgleaseui
