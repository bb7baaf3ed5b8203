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

// fakePool hands out fakeConns, or fails with err.
type fakePool struct {
	err   error
	conns []*fakeConn
}

func (p *fakePool) get(context.Context) (PoolConn, error) {
	if p.err != nil {
		return nil, p.err
	}
	c := &fakeConn{}
	p.conns = append(p.conns, c)
	return c, nil
}
func (p *fakePool) stat() (int, int, int) { return 0, 0, 2 }

// TestTakeClaim checks, with no server, that a claim's connection is taken
// within the claims' bound and that every way out gives the bound back
// once: a connection the pool could not give, and a statement done.
func TestTakeClaim(t *testing.T) {
	t.Parallel()
	refused := errors.New("refused")
	pool := &fakePool{err: refused}
	c := &Conns{src: pool, slot: make(chan struct{}, 1), claims: claimBound{size: func() int { return 3 }}}
	c.back, c.backCancel = context.WithCancel(context.Background())
	// More claims than the bound of 2, each given up after a while rather
	// than waiting forever for a bound never given back.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range 5 { // each failure gave the bound back
		if _, _, err := c.take(ctx, useClaim); !errors.Is(err, refused) {
			t.Fatalf("a claim whose pool refused: %v", err)
		}
	}
	pool.err = nil
	for range 5 {
		_, done, err := c.take(ctx, useClaim)
		if err != nil {
			t.Fatal(err)
		}
		done()
	}
	for i, conn := range pool.conns {
		if conn.released != 1 {
			t.Errorf("connection %d was released %d times, want 1", i, conn.released)
		}
	}
	if c.claims.held != 0 {
		t.Errorf("the claims' bound holds %d after every claim was done, want 0", c.claims.held)
	}
	ended, end := context.WithCancel(context.Background())
	end()
	if _, _, err := c.take(ended, useClaim); !errors.Is(err, context.Canceled) {
		t.Errorf("a claim whose context had ended: %v", err)
	}
	if c.claims.held != 0 {
		t.Errorf("a claim whose context had ended kept %d of the claims' bound", c.claims.held)
	}
}

// TestReleasedRefusesAStrangeDB checks that Released, given a DB that
// ReleaseNow never returns, says so rather than silently keeping its
// connection from the pool.
func TestReleasedRefusesAStrangeDB(t *testing.T) {
	t.Parallel()
	c := &Conns{}
	defer func() {
		if recover() == nil {
			t.Error("Released gave back a DB it does not know without a word")
		}
	}()
	c.Released(context.Background(), &fakeConn{})
}

// TestNoDeadline: the context pgxpool is asked for a connection under has
// no deadline, yet ends with the caller's; one that had none is the
// caller's own.
func TestNoDeadline(t *testing.T) {
	t.Parallel()
	plain, stop := context.WithCancel(context.Background())
	defer stop()
	if got := NoDeadline(plain); got != plain {
		t.Fatalf("a context with no deadline came back as %v, want itself", got)
	}
	timed, cancel := context.WithTimeout(context.Background(), time.Hour)
	got := NoDeadline(timed)
	if _, ok := got.Deadline(); ok {
		t.Fatal("the context given for the pool's connection has a deadline")
	}
	cancel()
	select {
	case <-got.Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the context without the deadline did not end with the caller's")
	}
	if !errors.Is(got.Err(), context.Canceled) {
		t.Fatalf("it ended with %v, want the caller's error", got.Err())
	}
}

// TestUncancelled: Unlock's statements never end with its caller's
// context; one that can end neither is the caller's own.
func TestUncancelled(t *testing.T) {
	t.Parallel()
	plain := context.WithValue(context.Background(), t, "v")
	if got := Uncancelled(plain); got != plain {
		t.Fatalf("a context that never ends came back as %v, want itself", got)
	}
	for _, parent := range []func() (context.Context, context.CancelFunc){
		func() (context.Context, context.CancelFunc) { return context.WithCancel(plain) },
		func() (context.Context, context.CancelFunc) { return context.WithTimeout(plain, time.Hour) },
	} {
		ctx, cancel := parent()
		got := Uncancelled(ctx)
		cancel()
		if _, ok := got.Deadline(); ok || got.Done() != nil || got.Err() != nil {
			t.Fatalf("Uncancelled of a context that ends: deadline, end or error (%v)", got.Err())
		}
		if got.Value(t) != "v" {
			t.Fatal("Uncancelled lost the caller's values")
		}
	}
}
