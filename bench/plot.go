package main

import (
	"fmt"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"

	"github.com/pglease/pglease/bench/internal/lab"
)

// plotStorage draws the table and index size of each release style over
// the cycles.
func plotStorage(dir string, runs []storageRun) error {
	p := lab.NewPlot(fmt.Sprintf("Lease table size over claim/release cycles (%d keys)", runs[0].Keys),
		"cycles", "size (KiB, log scale)")
	p.X.Tick.Marker = wholeTicks{}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	var lines []any
	for _, r := range runs {
		var heap, index plotter.XYs
		for _, s := range r.Samples {
			if s.Cycle == 0 {
				continue // the empty table: nothing to draw on a log scale
			}
			heap = append(heap, plotter.XY{X: float64(s.Cycle), Y: float64(s.HeapBytes) / 1024})
			index = append(index, plotter.XY{X: float64(s.Cycle), Y: float64(s.IndexBytes) / 1024})
		}
		lines = append(lines, r.Style+": table", heap, r.Style+": index", index)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return err
	}
	p.Y.Max *= 10 // room for the legend above the lines
	return lab.SaveSVG(p, filepath.Join(dir, "storage.svg"))
}

// plotDeadTuples draws the dead tuples of each release style over the
// cycles; the drops are (auto)vacuums and page pruning.
func plotDeadTuples(dir string, runs []storageRun) error {
	p := lab.NewPlot("Dead tuples over claim/release cycles", "cycles", "n_dead_tup")
	p.X.Tick.Marker, p.Y.Tick.Marker = wholeTicks{}, wholeTicks{}
	p.Y.Min = 0
	var lines []any
	for _, r := range runs {
		dead := make(plotter.XYs, len(r.Samples))
		for i, s := range r.Samples {
			dead[i] = plotter.XY{X: float64(s.Cycle), Y: float64(s.DeadTuples)}
		}
		lines = append(lines, r.Style, dead)
	}
	if err := plotutil.AddLines(p, lines...); err != nil {
		return err
	}
	return lab.SaveSVG(p, filepath.Join(dir, "dead_tuples.svg"))
}

// plotHeartbeat draws the cost of one heartbeat round against the number
// of leases held, log-log, for each heartbeat style.
func plotHeartbeat(dir string, points []beatPoint) error {
	p := lab.NewPlot("One heartbeat round vs leases held (durable server)", "leases held by one Locker", "round (ms)")
	logLog(p)
	lines := linesByStyle(points, func(pt beatPoint) (string, plotter.XY) {
		return pt.Style, plotter.XY{X: float64(pt.Leases), Y: pt.Round.Seconds() * 1000}
	})
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return lab.SaveSVG(p, filepath.Join(dir, "heartbeat.svg"))
}

// logLog puts both axes of p on a log scale.
func logLog(p *plot.Plot) {
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
}

// linesByStyle groups the points into one line per style, in the order the
// styles first appear, as plotutil.AddLinePoints takes them: name, points,
// name, points... A point whose y is not positive (unknown, or off a log
// scale) is left out, and so is a style left with none.
func linesByStyle[P any](points []P, at func(P) (style string, xy plotter.XY)) []any {
	byStyle := map[string]plotter.XYs{}
	var order []string
	for _, pt := range points {
		style, xy := at(pt)
		if xy.Y <= 0 {
			continue
		}
		if _, ok := byStyle[style]; !ok {
			order = append(order, style)
		}
		byStyle[style] = append(byStyle[style], xy)
	}
	var lines []any
	for _, style := range order {
		lines = append(lines, style, byStyle[style])
	}
	return lines
}

// wholeTicks are plot.DefaultTicks labelled as whole numbers: cycles and
// sizes have no useful decimals.
type wholeTicks struct{}

func (wholeTicks) Ticks(min, max float64) []plot.Tick {
	ticks := plot.DefaultTicks{}.Ticks(min, max)
	for i := range ticks {
		if ticks[i].Label != "" {
			ticks[i].Label = strconv.FormatFloat(ticks[i].Value, 'f', 0, 64)
		}
	}
	return ticks
}

// plotFleet draws one fleet tick against the number of jobs due together,
// for each style: the time until every job has started, and the server's
// CPU time per tick.
func plotFleet(dir string, points []tickPoint) error {
	for _, fig := range []struct {
		file, title, y string
		value          func(tickPoint) float64
	}{
		{"fleet_tick.svg", "A fleet tick: time until every job has started (durable server)", "tick (ms)",
			func(p tickPoint) float64 { return p.Tick.Seconds() * 1000 }},
		{"fleet_cpu.svg", "A fleet tick: server CPU time per tick (durable server)", "server CPU per tick (ms)",
			func(p tickPoint) float64 { return p.CPU * 1000 }},
	} {
		p := lab.NewPlot(fig.title, "jobs due at the same instant, on each replica", fig.y)
		logLog(p)
		// A value of 0 or less is unknown (CPU of a server in a container),
		// or too small for a log scale: linesByStyle leaves it out.
		lines := linesByStyle(points, func(pt tickPoint) (string, plotter.XY) {
			return pt.Style, plotter.XY{X: float64(pt.Jobs), Y: fig.value(pt)}
		})
		if len(lines) == 0 {
			continue
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return err
		}
		if err := lab.SaveSVG(p, filepath.Join(dir, fig.file)); err != nil {
			return err
		}
	}
	return nil
}
