package main

import (
	"github.com/jackc/pgx/v5"

	"github.com/pglease/pglease/internal/sqlstmt"
)

// The baselines send pglease's own statements (internal/sqlstmt), rendered
// for their table as a Locker renders them.

// deleteReleaseSQL is the release of the DELETE design the storage study
// compares against: the row goes, and the next claim inserts a fresh one.
// It keeps the guard and the asynchronous commit of pglease's release, so
// that the two designs differ only in what they do to the table.
const deleteReleaseSQL = `DELETE FROM {table}
 WHERE key = $1 AND holder = $2 AND fence = $3
   AND set_config('synchronous_commit', 'off', true) IS NOT NULL`

// render fills a statement template for table the way a Locker does.
func render(tmpl, table string) string { return sqlstmt.Render(tmpl, pgx.Identifier{table}) }
