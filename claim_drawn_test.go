package pglease

import (
	"sync"
	"testing"
)

// TestDrawnFences is a Locker's memory of the fences its claims drew,
// without a database: it only grows, whatever order concurrent claims
// report in.
func TestDrawnFences(t *testing.T) {
	t.Run("OnlyGrows", func(t *testing.T) {
		var l Locker
		var wg sync.WaitGroup
		for f := range int64(100) {
			wg.Go(func() { l.sawDrawn(100 - f) })
		}
		wg.Wait()
		if got := l.drawn.Load(); got != 100 {
			t.Fatalf("drawn = %d after fences 1 to 100, want 100", got)
		}
		l.sawDrawn(7)
		if got := l.drawn.Load(); got != 100 {
			t.Fatalf("drawn = %d after a smaller fence, want 100", got)
		}
	})
}
