package skew

import (
	"testing"
	"time"
)

const ms = time.Millisecond

var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

func TestMeasure(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name                string
		serverAfterSend     time.Duration // server's reading minus the local send time
		took                time.Duration
		offset, uncertainty time.Duration
	}{
		{"SameClockMidway", 5 * ms, 10 * ms, 0, 5 * ms},
		{"ServerAhead", 3*time.Second + 5*ms, 10 * ms, 3 * time.Second, 5 * ms},
		{"ServerBehind", -2 * time.Second, 0, -2 * time.Second, 0},
		{"LongRoundTripIsWide", 0, time.Second, -500 * ms, 500 * ms},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := Measure(t0.Add(tc.serverAfterSend), t0, tc.took)
			if s.Offset != tc.offset || s.Uncertainty != tc.uncertainty || !s.At.Equal(t0) {
				t.Fatalf("got %+v, want offset %v ± %v at the send", s, tc.offset, tc.uncertainty)
			}
		})
	}
}

func TestSample(t *testing.T) {
	t.Parallel()
	t.Run("Beyond", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			offset, uncertainty, want time.Duration
		}{{0, 0, 0}, {100 * ms, 30 * ms, 70 * ms}, {-100 * ms, 30 * ms, 70 * ms}, {20 * ms, 30 * ms, 0}} {
			if got := (Sample{Offset: tc.offset, Uncertainty: tc.uncertainty}).Beyond(); got != tc.want {
				t.Errorf("%v ± %v: Beyond %v, want %v", tc.offset, tc.uncertainty, got, tc.want)
			}
		}
	})
	t.Run("Overlaps", func(t *testing.T) {
		t.Parallel()
		for _, tc := range []struct {
			a, b Sample
			want bool
		}{
			{Sample{Offset: 0, Uncertainty: 5 * ms}, Sample{Offset: 10 * ms, Uncertainty: 5 * ms}, true},
			{Sample{Offset: 0, Uncertainty: 5 * ms}, Sample{Offset: 11 * ms, Uncertainty: 5 * ms}, false},
			{Sample{Offset: -time.Second}, Sample{Offset: time.Second, Uncertainty: 3 * time.Second}, true},
		} {
			if a, b := tc.a.Overlaps(tc.b), tc.b.Overlaps(tc.a); a != tc.want || b != tc.want {
				t.Errorf("%+v and %+v: overlap %v/%v, want %v", tc.a, tc.b, a, b, tc.want)
			}
		}
	})
}

func TestFilter(t *testing.T) {
	t.Parallel()
	at := func(i int) time.Time { return t0.Add(time.Duration(i) * time.Second) }
	s := func(i int, offset, uncertainty time.Duration) Sample {
		return Sample{Offset: offset, Uncertainty: uncertainty, At: at(i)}
	}

	t.Run("NoReadingBeforeTheFirstSample", func(t *testing.T) {
		t.Parallel()
		var f Filter
		if r, ok := f.Get(); ok {
			t.Fatalf("a reading %+v before any sample", r)
		}
		f.Add(s(1, 0, ms), time.Second)
		if _, ok := f.Get(); !ok {
			t.Fatal("no reading after a sample")
		}
	})

	cases := []struct {
		name    string
		samples []Sample
		want    Sample
	}{
		{"KeepsTheNarrowest", []Sample{s(1, 3*ms, 2*ms), s(2, 10*ms, 20*ms), s(3, -5*ms, 9*ms)}, s(1, 3*ms, 2*ms)},
		{"OfEquallyNarrowTheNewest", []Sample{s(1, 1*ms, 2*ms), s(2, 2*ms, 2*ms), s(3, 0, 5*ms)}, s(2, 2*ms, 2*ms)},
		{"ForgetsTheNarrowestAfterAWindow", append([]Sample{s(0, 0, ms)}, func() []Sample {
			var out []Sample
			for i := 1; i <= Window; i++ {
				out = append(out, s(i, 0, time.Duration(i+1)*ms))
			}
			return out
		}()...), s(1, 0, 2*ms)},
		{"FollowsAStepAtOnce", []Sample{s(1, 0, ms), s(2, 0, ms), s(3, 3*time.Second, 40*ms)}, s(3, 3*time.Second, 40*ms)},
		{"AWideSampleThatMeetsTheReadingDoesNotReplaceIt", []Sample{s(1, 0, ms), s(2, 300*ms, time.Second)}, s(1, 0, ms)},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var (
				f Filter
				r Sample
			)
			for _, x := range tc.samples {
				r, _, _ = f.Add(x, time.Second)
			}
			if got, _ := f.Get(); r != tc.want || got != tc.want {
				t.Fatalf("reading %+v (Get %+v), want %+v", r, got, tc.want)
			}
		})
	}

	t.Run("ReportsEachCrossingOfTheBoundOnce", func(t *testing.T) {
		t.Parallel()
		bound := 500 * ms
		steps := []struct {
			offset   time.Duration
			up, down bool
		}{
			{0, false, false},
			{2 * time.Second, true, false},
			{2 * time.Second, false, false},
			{2*time.Second + ms, false, false},
			{0, false, true},
			{0, false, false},
			{-2 * time.Second, true, false},
		}
		var f Filter
		for i, st := range steps {
			_, up, down := f.Add(s(i, st.offset, ms), bound)
			if up != st.up || down != st.down {
				t.Fatalf("sample %d (%v): up %v down %v, want %v %v", i, st.offset, up, down, st.up, st.down)
			}
		}
	})
}
