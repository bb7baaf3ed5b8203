package coalesce

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// statements is a Send that records every statement and holds each one
// until the test lets it return; each result is its q times ten.
type statements struct {
	mu      sync.Mutex
	sent    [][]int
	ctxs    []context.Context
	entered chan int      // the index of each statement as it is sent
	proceed chan struct{} // one value lets one statement return
}

func newStatements() *statements {
	return &statements{entered: make(chan int, 100), proceed: make(chan struct{}, 100)}
}

func (s *statements) send(ctx context.Context, qs, rs []int) {
	s.mu.Lock()
	s.sent = append(s.sent, slices.Clone(qs))
	s.ctxs = append(s.ctxs, ctx)
	i := len(s.sent) - 1
	s.mu.Unlock()
	s.entered <- i
	<-s.proceed
	for j, q := range qs {
		rs[j] = q * 10
	}
}

func (s *statements) batches() [][]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.sent)
}

func (s *statements) ctx(i int) context.Context {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.ctxs[i]
}

// entry waits for the next statement to be sent.
func entry(t *testing.T, s *statements) int {
	t.Helper()
	select {
	case i := <-s.entered:
		return i
	case <-time.After(5 * time.Second):
		t.Fatal("no statement was sent")
		return -1
	}
}

// lookedAtLate is a context whose first Done call says so on looking and
// then waits for look to close: a caller that looks at its context and its
// result only once the test has let both happen.
type lookedAtLate struct {
	context.Context
	once    sync.Once
	looking chan struct{}
	look    chan struct{}
}

func (c *lookedAtLate) Done() <-chan struct{} {
	first := false
	c.once.Do(func() { first = true })
	if first {
		close(c.looking)
		<-c.look
	}
	return c.Context.Done()
}

type result struct {
	q, r      int
	handedOff bool
	err       error
}

// do runs c.Do(ctx, q) on a goroutine of its own.
func do(ctx context.Context, c *Coalescer[int, int], q int, out chan<- result) {
	go func() {
		r, h, err := c.Do(ctx, q)
		out <- result{q: q, r: r, handedOff: h, err: err}
	}()
}

// queueOf returns a Coalescer's onQueue that counts calls queued.
func queueOf(n int) (func(), chan struct{}) {
	ch := make(chan struct{}, n)
	return func() { ch <- struct{}{} }, ch
}

func waitN(t *testing.T, ch <-chan struct{}, n int) {
	t.Helper()
	for range n {
		select {
		case <-ch:
		case <-time.After(5 * time.Second):
			t.Fatal("a call never queued")
		}
	}
}

// queuedBehindOne sends call 1 on c (of limit 1) alone, then calls 2 and
// 3, and returns once both are queued behind call 1's statement, which
// still runs: out receives each call's result, leave2 and leave3 end the
// contexts of calls 2 and 3 with a cause.
func queuedBehindOne(t *testing.T, s *statements, c *Coalescer[int, int]) (out chan result, leave2, leave3 context.CancelCauseFunc) {
	t.Helper()
	onQueue, queued := queueOf(2)
	c.onQueue = onQueue
	out = make(chan result, 3)
	do(context.Background(), c, 1, out)
	entry(t, s)
	ctx2, leave2 := context.WithCancelCause(context.Background())
	ctx3, leave3 := context.WithCancelCause(context.Background())
	do(ctx2, c, 2, out)
	do(ctx3, c, 3, out)
	waitN(t, queued, 2)
	return out, leave2, leave3
}

// resultAsCallerLeft queues call 7 on a Coalescer with orphan, ends its
// caller's context, sends its statement and lets it return, and only then
// lets Do look at its context and its result; it returns what Do returned,
// once every goroutine of the Coalescer has ended.
func resultAsCallerLeft(t *testing.T, orphan func(q, r int)) result {
	t.Helper()
	s := newStatements()
	c := &Coalescer[int, int]{Send: s.send, Limit: 1, Orphan: orphan}
	onQueue, queued := queueOf(1)
	c.Hold(onQueue)
	inner, leave := context.WithCancel(context.Background())
	ctx := &lookedAtLate{Context: inner, looking: make(chan struct{}), look: make(chan struct{})}
	out := make(chan result, 1)
	do(ctx, c, 7, out)
	waitN(t, queued, 1)
	<-ctx.looking // Do is about to wait
	leave()
	s.proceed <- struct{}{}
	c.Release()
	entry(t, s)
	c.Wait() // the statement returned and its result was handed over
	close(ctx.look)
	r := <-out
	c.Wait()
	return r
}

func TestCoalescer(t *testing.T) {
	t.Parallel()

	t.Run("SendsACallAloneWhenPlacesAreFree", func(t *testing.T) {
		t.Parallel()
		for _, limit := range []int{1, 2, 4} {
			s := newStatements()
			c := &Coalescer[int, int]{Send: s.send, Limit: limit}
			out := make(chan result, limit)
			for q := range limit {
				do(context.Background(), c, q, out)
			}
			for range limit {
				entry(t, s)
			}
			for range limit {
				s.proceed <- struct{}{}
			}
			for range limit {
				if r := <-out; r.err != nil || r.r != r.q*10 {
					t.Fatalf("limit %d: call %d got %d, %v", limit, r.q, r.r, r.err)
				}
			}
			for _, b := range s.batches() {
				if len(b) != 1 {
					t.Fatalf("limit %d: a statement carried %v, want one call each", limit, b)
				}
			}
		}
	})

	t.Run("SendsCallsQueuedMeanwhileInOneStatement", func(t *testing.T) {
		t.Parallel()
		cases := []struct {
			limit, calls int
		}{{1, 2}, {1, 8}, {2, 9}, {4, 40}}
		for _, tc := range cases {
			s := newStatements()
			onQueue, queued := queueOf(tc.calls)
			c := &Coalescer[int, int]{Send: s.send, Limit: tc.limit}
			c.onQueue = onQueue
			out := make(chan result, tc.calls)
			for q := range tc.limit {
				do(context.Background(), c, q, out)
				entry(t, s)
			}
			for q := tc.limit; q < tc.calls; q++ {
				do(context.Background(), c, q, out)
			}
			waitN(t, queued, tc.calls-tc.limit)
			for range tc.calls {
				s.proceed <- struct{}{}
			}
			for range tc.calls {
				if r := <-out; r.err != nil || r.r != r.q*10 {
					t.Fatalf("%+v: call %d got %d, %v", tc, r.q, r.r, r.err)
				}
			}
			if n := len(s.batches()); n != tc.limit+1 {
				t.Fatalf("%+v: %d statements %v, want limit+1", tc, n, s.batches())
			}
			if got := s.batches()[tc.limit]; len(got) != tc.calls-tc.limit {
				t.Fatalf("%+v: the last statement carried %v", tc, got)
			}
		}
	})

	t.Run("NeverSendsACallWhoseCallerLeftWhileQueued", func(t *testing.T) {
		t.Parallel()
		s := newStatements()
		out, leave, _ := queuedBehindOne(t, s, &Coalescer[int, int]{Send: s.send, Limit: 1})
		gone := errors.New("gone")
		leave(gone)
		if r := <-out; r.q != 2 || !errors.Is(r.err, gone) || r.handedOff {
			t.Fatalf("the call that left got %+v, want its cause and not handed off", r)
		}
		s.proceed <- struct{}{}
		s.proceed <- struct{}{}
		<-out
		<-out
		if got := s.batches(); len(got) != 2 || !slices.Equal(got[1], []int{3}) {
			t.Fatalf("statements %v, want [1] then [3]", got)
		}
	})

	t.Run("HandsTheResultOfACallerWhoLeftAfterItWasSentToOrphan", func(t *testing.T) {
		t.Parallel()
		s := newStatements()
		orphans := make(chan [2]int, 1)
		c := &Coalescer[int, int]{Send: s.send, Limit: 1, Orphan: func(q, r int) { orphans <- [2]int{q, r} }}
		out, leave, _ := queuedBehindOne(t, s, c)
		s.proceed <- struct{}{} // [1] returns; [2 3] is sent
		entry(t, s)
		leave(nil) // context.Canceled
		var left result
		for range 2 {
			if r := <-out; r.q == 2 {
				left = r
			}
		}
		if !left.handedOff || !errors.Is(left.err, context.Canceled) {
			t.Fatalf("the caller who left got %+v, want handed off with its cause", left)
		}
		if s.ctx(1).Err() != nil {
			t.Fatal("the statement was cancelled while call 3 still waited on it")
		}
		s.proceed <- struct{}{}
		if r := <-out; r.q != 3 || r.r != 30 || r.err != nil {
			t.Fatalf("call 3 got %+v", r)
		}
		if o := <-orphans; o != [2]int{2, 20} {
			t.Fatalf("Orphan got %v, want [2 20]", o)
		}
	})

	// The caller stops waiting, then its statement returns, and only then
	// does Do look at either: both are ready at once. A random pick between
	// the two would fail one run in two.
	t.Run("HandsToOrphanAResultThatCameAsItsCallerLeft", func(t *testing.T) {
		t.Parallel()
		for range 64 {
			orphans := make(chan [2]int, 1)
			r := resultAsCallerLeft(t, func(q, r int) { orphans <- [2]int{q, r} })
			if !r.handedOff || !errors.Is(r.err, context.Canceled) {
				t.Fatalf("the caller who left got %+v, want handed off with its cause", r)
			}
			select {
			case o := <-orphans:
				if o != [2]int{7, 70} {
					t.Fatalf("Orphan got %v, want [7 70]", o)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the result never reached Orphan")
			}
		}
	})

	t.Run("WithoutOrphanGivesTheCallerAResultThatCameAsItLeft", func(t *testing.T) {
		t.Parallel()
		for range 64 {
			if r := resultAsCallerLeft(t, nil); r.handedOff || r.err != nil || r.r != 70 {
				t.Fatalf("the caller got %+v, want its result", r)
			}
		}
	})

	t.Run("CancelsAStatementOnceEveryCallerInItLeft", func(t *testing.T) {
		t.Parallel()
		s := newStatements()
		c := &Coalescer[int, int]{Send: s.send, Limit: 1}
		out, cancel2, cancel3 := queuedBehindOne(t, s, c)
		s.proceed <- struct{}{}
		<-out
		entry(t, s)
		first, last := errors.New("first to leave"), errors.New("last to leave")
		cancel2(first)
		<-out
		if s.ctx(1).Err() != nil {
			t.Fatal("the statement ended while a caller still waited")
		}
		cancel3(last)
		<-out
		select {
		case <-s.ctx(1).Done():
		case <-time.After(5 * time.Second):
			t.Fatal("the statement's context never ended")
		}
		// The cause is one of the callers': the last whose end was seen.
		if cause := context.Cause(s.ctx(1)); !errors.Is(cause, last) && !errors.Is(cause, first) {
			t.Fatalf("statement ended with %v, want the cause of one of its callers", cause)
		}
		s.proceed <- struct{}{}
		c.Wait()
	})

	t.Run("ALingeringStatementGivesItsPlaceToTheQueue", func(t *testing.T) {
		t.Parallel()
		s := newStatements()
		c := &Coalescer[int, int]{Send: s.send, Limit: 1, Linger: 5 * time.Millisecond}
		out := make(chan result, 2)
		do(context.Background(), c, 1, out)
		entry(t, s)
		do(context.Background(), c, 2, out)
		entry(t, s) // sent while [1] is still in flight
		s.proceed <- struct{}{}
		s.proceed <- struct{}{}
		<-out
		<-out
		if got := s.batches(); len(got) != 2 || len(got[0]) != 1 || len(got[1]) != 1 {
			t.Fatalf("statements %v, want two of one call each", got)
		}
		c.Wait()
	})

	t.Run("WaitReturnsOnlyOnceTheOrphanHasRun", func(t *testing.T) {
		t.Parallel()
		s := newStatements()
		onQueue, queued := queueOf(1)
		orphanRuns := make(chan struct{})
		orphanDone := make(chan struct{})
		c := &Coalescer[int, int]{Send: s.send, Limit: 1, Orphan: func(int, int) { <-orphanRuns; close(orphanDone) }}
		c.onQueue = onQueue
		out := make(chan result, 2)
		do(context.Background(), c, 1, out)
		entry(t, s)
		ctx, cancel := context.WithCancel(context.Background())
		do(ctx, c, 2, out)
		waitN(t, queued, 1)
		s.proceed <- struct{}{}
		entry(t, s)
		cancel()
		<-out
		<-out
		s.proceed <- struct{}{}
		waited := make(chan struct{})
		go func() { c.Wait(); close(waited) }()
		select {
		case <-waited:
			t.Fatal("Wait returned while the orphan was still running")
		case <-time.After(20 * time.Millisecond):
		}
		close(orphanRuns)
		<-waited
		select {
		case <-orphanDone:
		default:
			t.Fatal("Wait returned before the orphan finished")
		}
	})

	t.Run("HoldQueuesEveryCallUntilReleaseSendsThemInOne", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{1, 3, 10} {
			s := newStatements()
			c := &Coalescer[int, int]{Send: s.send, Limit: 4}
			sendHeld(t, c, s, n)
			if got := s.batches(); len(got) != 1 || len(got[0]) != n {
				t.Fatalf("%d calls went in %v, want one statement", n, got)
			}
			c.Wait()
		}
	})

	// A statement's slices are used again by the next, up to keptCalls
	// calls: the room of a larger one is let go once it returns.
	t.Run("KeepsTheRoomOfSmallStatementsOnly", func(t *testing.T) {
		t.Parallel()
		for _, n := range []int{10, keptCalls + 1, 4 * keptCalls} {
			s := newStatements()
			c := &Coalescer[int, int]{Send: s.send, Limit: 1}
			sendHeld(t, c, s, n)
			c.Wait()
			c.mu.Lock()
			room := cap(c.queue)
			for _, b := range c.bursts {
				room = max(room, cap(b.calls), cap(b.qs), cap(b.rs))
			}
			spares := len(c.bursts)
			c.mu.Unlock()
			switch {
			case spares != 1:
				t.Fatalf("after a statement of %d: %d spare statements, want the one that ran", n, spares)
			case n > keptCalls && room != 0:
				t.Fatalf("after a statement of %d calls, room for %d is kept", n, room)
			case n <= keptCalls && room < n:
				t.Fatalf("after a statement of %d calls, room for %d is kept, want its own", n, room)
			}
		}
	})
}

// sendHeld queues n calls on c, held, then releases them into one
// statement of s, lets it return, and checks that each call got its own
// result.
func sendHeld(t *testing.T, c *Coalescer[int, int], s *statements, n int) {
	t.Helper()
	onQueue, queued := queueOf(n)
	c.Hold(onQueue)
	out := make(chan result, n)
	for q := range n {
		do(context.Background(), c, q, out)
	}
	waitN(t, queued, n)
	c.Release()
	entry(t, s)
	s.proceed <- struct{}{}
	for range n {
		if r := <-out; r.r != r.q*10 {
			t.Fatalf("call %d got %d", r.q, r.r)
		}
	}
}

// TestCoalescerPlacesUnderLinger attacks the one flag through which a
// statement sent alone gives its place in flight up: statements that
// return before, at about, and after their Linger, many callers at once,
// some giving up while queued or in flight. Guarantee: the places in
// flight never count more than Limit nor fewer than zero, and all are free
// at the end; every call is sent at most once, a call sent has its result
// either returned or handed to Orphan, once, and a call whose caller left
// unsent is never sent; no call is left queued.
func TestCoalescerPlacesUnderLinger(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 3} {
		for _, linger := range []time.Duration{0, 300 * time.Microsecond, 2 * time.Millisecond} {
			t.Run(fmt.Sprintf("Limit=%d/Linger=%v", limit, linger), func(t *testing.T) {
				t.Parallel()
				const (
					callers = 32
					each    = 150
				)
				var (
					c       *Coalescer[int, int]
					mu      sync.Mutex
					sends   = map[int]int{} // q: times sent
					orphans = map[int]int{} // q: times handed to Orphan
					bad     atomic.Value
				)
				flag := func(format string, args ...any) { bad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
				c = &Coalescer[int, int]{
					Limit:  limit,
					Linger: linger,
					Send: func(ctx context.Context, qs, rs []int) {
						c.mu.Lock()
						if c.flying < 0 || c.flying > limit {
							flag("%d places in flight, Limit %d", c.flying, limit)
						}
						c.mu.Unlock()
						mu.Lock()
						for _, q := range qs {
							sends[q]++
						}
						mu.Unlock()
						// Around the Linger: before, at, after it.
						switch qs[0] % 4 {
						case 0:
						case 1:
							time.Sleep(linger)
						case 2:
							time.Sleep(linger / 2)
						case 3:
							time.Sleep(2*linger + 50*time.Microsecond)
						}
						for i, q := range qs {
							rs[i] = q * 10
						}
					},
					Orphan: func(q, r int) {
						if r != q*10 {
							flag("orphan of %d got %d", q, r)
						}
						mu.Lock()
						orphans[q]++
						mu.Unlock()
					},
				}
				type gone struct {
					q         int
					handedOff bool
				}
				var (
					wg   sync.WaitGroup
					left = make(chan gone, callers*each)
				)
				for w := range callers {
					wg.Add(1)
					go func() {
						defer wg.Done()
						for i := range each {
							q := w*each + i
							ctx, cancel := context.Background(), context.CancelFunc(func() {})
							if i%5 == 0 {
								ctx, cancel = context.WithTimeout(ctx, time.Duration(i%3)*200*time.Microsecond)
							}
							r, handedOff, err := c.Do(ctx, q)
							cancel()
							switch {
							case err != nil:
								left <- gone{q, handedOff}
							case handedOff:
								flag("call %d handed off without an error", q)
							case r != q*10:
								flag("call %d got %d", q, r)
							}
						}
					}()
				}
				done := make(chan struct{})
				go func() { wg.Wait(); close(done) }()
				select {
				case <-done:
				case <-time.After(60 * time.Second):
					c.mu.Lock()
					t.Fatalf("callers still waiting: %d queued, %d places in flight", len(c.queue), c.flying)
				}
				c.Wait()
				close(left)
				if b := bad.Load(); b != nil {
					t.Fatal(b)
				}
				c.mu.Lock()
				flying, queued, running := c.flying, len(c.queue), c.running
				c.mu.Unlock()
				if flying != 0 || queued != 0 || running != 0 {
					t.Fatalf("after every call: %d places in flight, %d queued, %d goroutines", flying, queued, running)
				}
				mu.Lock()
				defer mu.Unlock()
				var nLeft, nHanded int
				wasLeft := map[int]bool{}
				for g := range left {
					nLeft++
					wasLeft[g.q] = true
					switch {
					case g.handedOff && (sends[g.q] != 1 || orphans[g.q] != 1):
						t.Errorf("call %d handed off: sent %d times, orphaned %d", g.q, sends[g.q], orphans[g.q])
					case !g.handedOff && sends[g.q] != 0:
						t.Errorf("call %d left unsent was sent %d times", g.q, sends[g.q])
					}
					if g.handedOff {
						nHanded++
					}
				}
				for q := range callers * each {
					if !wasLeft[q] && (sends[q] != 1 || orphans[q] != 0) {
						t.Errorf("call %d answered: sent %d times, orphaned %d", q, sends[q], orphans[q])
					}
				}
				t.Logf("%d calls, %d left (%d handed off)", callers*each, nLeft, nHanded)
			})
		}
	}
}

// TestCoalescerAloneBuffers attacks the buffers a call sent alone reuses
// (one): many callers at once, each statement returning before, about or
// after its Linger (a call whose place a lingering statement gave up may
// queue, and go in a statement of several). Guarantee: a statement finds its rs zeroed, and
// neither its qs nor its rs changes under it while it runs (no two calls
// share a buffer); each call gets its own result; every place in flight is
// free at the end.
func TestCoalescerAloneBuffers(t *testing.T) {
	t.Parallel()
	for _, linger := range []time.Duration{0, 200 * time.Microsecond, time.Second} {
		t.Run(fmt.Sprintf("Linger=%v", linger), func(t *testing.T) {
			t.Parallel()
			const callers, each = 16, 300
			var bad atomic.Value
			flag := func(format string, args ...any) { bad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
			c := &Coalescer[int, int]{Limit: callers, Linger: linger, Send: func(_ context.Context, qs, rs []int) {
				was := slices.Clone(qs)
				for i, q := range qs {
					if len(rs) != len(qs) || rs[i] != 0 {
						flag("call %d sent with %d qs, rs %v", q, len(qs), rs)
						return
					}
					rs[i] = q * 10
				}
				time.Sleep(time.Duration(qs[0]%4) * 100 * time.Microsecond) // before, at, after a Linger of 200µs
				for i, q := range was {
					if qs[i] != q || rs[i] != q*10 {
						flag("call %d: its buffers changed under it to q %d, r %d", q, qs[i], rs[i])
					}
				}
			}}
			var wg sync.WaitGroup
			for w := range callers {
				wg.Go(func() {
					for i := range each {
						q := w*each + i + 1
						if r, _, err := c.Do(context.Background(), q); err != nil || r != q*10 {
							flag("call %d got %d, %v", q, r, err)
						}
					}
				})
			}
			wg.Wait()
			c.Wait()
			if b := bad.Load(); b != nil {
				t.Fatal(b)
			}
			c.mu.Lock()
			defer c.mu.Unlock()
			if c.flying != 0 || len(c.queue) != 0 {
				t.Fatalf("after every call: %d places in flight, %d queued", c.flying, len(c.queue))
			}
		})
	}
}

// TestCoalescerBurstBuffers attacks what statements of queued calls reuse
// (each call, its channel, a statement's slices and its context): many
// callers on one or two places in flight, so that nearly every call goes
// in a statement of several, half of them giving up at a random moment;
// with and without Orphan. Guarantee: a statement finds its rs zeroed, and
// neither its qs nor its rs changes under it while it runs; its context
// ends only once every caller in it has given up, and then soon; each
// call is sent at most once; a caller gets its own result, or its own
// cause; a call whose caller gave up before it was sent is never sent, and
// one sent reaches Orphan once, with its own result; nothing is left in
// flight, queued or running.
func TestCoalescerBurstBuffers(t *testing.T) {
	t.Parallel()
	for _, limit := range []int{1, 2} {
		for _, orphan := range []bool{true, false} {
			t.Run(fmt.Sprintf("Limit=%d/Orphan=%v", limit, orphan), func(t *testing.T) {
				t.Parallel()
				burstBuffers(t, limit, orphan)
			})
		}
	}
}

func burstBuffers(t *testing.T, limit int, withOrphan bool) {
	t.Helper()
	const callers, each = 16, 200
	var (
		bad     atomic.Value
		mu      sync.Mutex
		sent    = map[int]bool{}
		orphans = map[int]int{}
		gaveUp  [callers*each + 1]atomic.Bool
	)
	flag := func(format string, args ...any) { bad.CompareAndSwap(nil, fmt.Sprintf(format, args...)) }
	allGone := func(qs []int) bool {
		for _, q := range qs {
			if !gaveUp[q].Load() {
				return false
			}
		}
		return true
	}
	c := &Coalescer[int, int]{Limit: limit, Send: func(ctx context.Context, qs, rs []int) {
		was := slices.Clone(qs)
		mu.Lock()
		for i, q := range qs {
			if len(rs) != len(qs) || rs[i] != 0 {
				flag("call %d sent with %d qs, rs %v", q, len(qs), rs)
			}
			if sent[q] {
				flag("call %d sent twice", q)
			}
			sent[q] = true
			rs[i] = q * 10
		}
		mu.Unlock()
		for end := time.Now().Add(time.Duration(was[0]%5) * 100 * time.Microsecond); time.Now().Before(end) && ctx.Err() == nil; {
			if allGone(was) {
				select {
				case <-ctx.Done():
				case <-time.After(2 * time.Second):
					flag("every caller of %v gave up, and its context did not end in 2s", was)
				}
				break
			}
			time.Sleep(20 * time.Microsecond)
		}
		if ctx.Err() != nil {
			for _, q := range was {
				if !gaveUp[q].Load() {
					flag("a statement of %v ended while the caller of %d still waited", was, q)
				}
			}
		}
		for i, q := range was {
			if qs[i] != q || rs[i] != q*10 {
				flag("call %d: its buffers changed under it to q %d, r %d", q, qs[i], rs[i])
			}
		}
	}}
	if withOrphan {
		c.Orphan = func(q, r int) {
			mu.Lock()
			defer mu.Unlock()
			if orphans[q]++; orphans[q] > 1 || r != q*10 {
				flag("orphan %d got %d, %d times", q, r, orphans[q])
			}
		}
	}
	var handed, unsent sync.Map
	var wg sync.WaitGroup
	for w := range callers {
		wg.Go(func() {
			for i := range each {
				q := w*each + i + 1
				ctx, cancel := context.WithCancelCause(context.Background())
				cause := fmt.Errorf("call %d gave up", q)
				if q%2 == 0 {
					time.AfterFunc(time.Duration(q%11)*50*time.Microsecond, func() {
						gaveUp[q].Store(true)
						cancel(cause)
					})
				}
				r, handedOff, err := c.Do(ctx, q)
				switch {
				case err == nil && (handedOff || r != q*10):
					flag("call %d got %d (handed off: %v)", q, r, handedOff)
				case err != nil && !errors.Is(err, cause):
					flag("call %d got the cause %v, not its own", q, err)
				case err != nil && handedOff:
					handed.Store(q, true)
				case err != nil:
					unsent.Store(q, true)
				}
				cancel(nil)
			}
		})
	}
	wg.Wait()
	c.Wait()
	if b := bad.Load(); b != nil {
		t.Fatal(b)
	}
	mu.Lock()
	defer mu.Unlock()
	handed.Range(func(q, _ any) bool {
		if withOrphan && orphans[q.(int)] != 1 {
			t.Errorf("call %d was handed off and reached Orphan %d times", q, orphans[q.(int)])
		}
		return true
	})
	unsent.Range(func(q, _ any) bool {
		if sent[q.(int)] {
			t.Errorf("call %d gave up unsent, yet was sent", q)
		}
		return true
	})
	n := 0
	handed.Range(func(_, _ any) bool { n++; return true })
	if n == 0 || len(sent) == callers*each {
		t.Errorf("%d calls handed off, %d of %d sent: no call was given up at the right moments", n, len(sent), callers*each)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.flying != 0 || len(c.queue) != 0 || c.running != 0 {
		t.Fatalf("after every call: %d places in flight, %d queued, %d goroutines", c.flying, len(c.queue), c.running)
	}
}
