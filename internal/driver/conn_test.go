package driver

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
)

// TestClaimBound checks, with no server, how many pool connections claims
// may hold; the root's TestConns proves it against PostgreSQL.
func TestClaimBound(t *testing.T) {
	t.Parallel()
	bound := func(size int) *claimBound {
		return &claimBound{size: func() int { return size }}
	}
	t.Run("ClaimsHoldAllButOneConnection", func(t *testing.T) {
		t.Parallel()
		b := bound(3)
		for range 2 {
			if _, err := b.take(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
		defer cancel()
		if limit, err := b.take(ctx); !errors.Is(err, context.DeadlineExceeded) || limit != 2 {
			t.Errorf("a third claim of a pool of 3: limit %d, err %v; want it to wait at the limit 2", limit, err)
		}
	})
	t.Run("AClaimGivenBackLetsTheNextIn", func(t *testing.T) {
		t.Parallel()
		b := bound(2)
		_, err := b.take(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		took := make(chan error, 1)
		go func() { _, err := b.take(context.Background()); took <- err }()
		b.give()
		select {
		case err := <-took:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the waiting claim was not let in once the first gave its connection back")
		}
	})
	t.Run("TheLastConnectionIsForBoundedWaits", func(t *testing.T) {
		t.Parallel()
		b := bound(4) // claims hold 3, of which 2 may wait without bound
		first := b.mayWait()
		second := b.mayWait()
		if !first || !second {
			t.Fatal("the first two claims of a pool of 4 may not wait without bound")
		}
		if !b.pressed() || b.mayWait() {
			t.Error("a third claim may wait without bound, leaving no connection to bounded waits")
		}
		b.waited()
		if b.pressed() || !b.mayWait() {
			t.Error("a claim that waited did not make room for the next")
		}
	})
	t.Run("OneConnectionNeverWaitsWithoutBound", func(t *testing.T) {
		t.Parallel()
		b := &claimBound{single: true}
		if b.mayWait() || !b.pressed() {
			t.Error("a claim on a single connection may wait without bound, the heartbeat behind it")
		}
	})
	t.Run("APoolWithoutALimitIsNotBounded", func(t *testing.T) {
		t.Parallel()
		b := bound(0)
		for range 100 {
			if !b.mayWait() {
				t.Fatal("a claim of a pool without a limit may not wait")
			}
			if _, err := b.take(context.Background()); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("ClaimLimitIsAtMostThePoolsBound", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct{ size, most, want int }{{0, 4, 4}, {2, 4, 1}, {3, 4, 2}, {10, 4, 4}} {
			size := tc.size
			c := &Conns{claims: claimBound{size: func() int { return size }}}
			if got := c.ClaimLimit(tc.most); got != tc.want {
				t.Errorf("pool of %d, at most %d: ClaimLimit = %d, want %d", tc.size, tc.most, got, tc.want)
			}
		}
	})
}

// fakeRows are rows of no row that report err, and count their Close.
type fakeRows struct {
	pgx.Rows
	err    error
	closed *int
}

func (r fakeRows) Next() bool { return false }
func (r fakeRows) Close()     { *r.closed++ }
func (r fakeRows) Err() error { return r.err }

// fakeConn is a pool connection whose every Query returns fakeRows with
// the error named by its SQL.
type fakeConn struct {
	PoolConn
	closed, released int
}

func (c *fakeConn) Query(_ context.Context, sql string, _ ...any) (pgx.Rows, error) {
	return fakeRows{err: errors.New(sql), closed: &c.closed}, nil
}
func (c *fakeConn) Release() { c.released++ }

// TestTakenDBRows checks the rows a taken connection keeps for its latest
// Query (takenDB.rows): each statement, sent once the previous one's rows
// are closed, reads its own rows and its own error, closing them closes
// the driver's once, and the connection goes back to its pool once.
func TestTakenDBRows(t *testing.T) {
	t.Parallel()
	conn := &fakeConn{}
	d := &takenDB{db: conn}
	for i, sql := range []string{"first", "second", "third"} {
		rows, err := d.Query(context.Background(), sql)
		if err != nil {
			t.Fatal(err)
		}
		for rows.Next() {
		}
		rows.Close()
		if err := rows.Err(); err == nil || err.Error() != sql {
			t.Errorf("statement %q read the error %v", sql, err)
		}
		if conn.closed != i+1 {
			t.Errorf("after statement %q, the driver's rows were closed %d times, want %d", sql, conn.closed, i+1)
		}
	}
	d.back()
	if conn.released != 1 {
		t.Errorf("the connection was released %d times, want 1", conn.released)
	}
}
