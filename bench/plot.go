package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/plotutil"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// plotStorage draws the table and index size of each release style over
// the cycles.
func plotStorage(dir string, runs []storageRun) error {
	p := plot.New()
	p.Title.Text = fmt.Sprintf("Lease table size over claim/release cycles (%d keys)", runs[0].Keys)
	p.X.Label.Text = "cycles"
	p.Y.Label.Text = "size (KiB, log scale)"
	p.X.Tick.Marker = wholeTicks{}
	p.Y.Scale, p.Y.Tick.Marker = plot.LogScale{}, plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
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
	return save(p, filepath.Join(dir, "storage.svg"))
}

// plotDeadTuples draws the dead tuples of each release style over the
// cycles; the drops are (auto)vacuums and page pruning.
func plotDeadTuples(dir string, runs []storageRun) error {
	p := plot.New()
	p.Title.Text = "Dead tuples over claim/release cycles"
	p.X.Label.Text = "cycles"
	p.Y.Label.Text = "n_dead_tup"
	p.X.Tick.Marker, p.Y.Tick.Marker = wholeTicks{}, wholeTicks{}
	p.Y.Min = 0
	p.Legend.Top = true
	p.Legend.Left = true
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
	return save(p, filepath.Join(dir, "dead_tuples.svg"))
}

// plotHeartbeat draws the cost of one heartbeat round against the number
// of leases held, log-log, for each heartbeat style.
func plotHeartbeat(dir string, points []beatPoint) error {
	p := plot.New()
	p.Title.Text = "One heartbeat round vs leases held (durable server)"
	p.X.Label.Text = "leases held by one Locker"
	p.Y.Label.Text = "round (ms)"
	p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
	p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
	p.Legend.Top = true
	p.Legend.Left = true
	byStyle := map[string]plotter.XYs{}
	var order []string
	for _, pt := range points {
		if _, ok := byStyle[pt.Style]; !ok {
			order = append(order, pt.Style)
		}
		byStyle[pt.Style] = append(byStyle[pt.Style], plotter.XY{X: float64(pt.Leases), Y: pt.Round.Seconds() * 1000})
	}
	var lines []any
	for _, style := range order {
		lines = append(lines, style, byStyle[style])
	}
	if err := plotutil.AddLinePoints(p, lines...); err != nil {
		return err
	}
	return save(p, filepath.Join(dir, "heartbeat.svg"))
}

// save writes p as an SVG of 8x4.5 inches. The fonts are not embedded (that
// would weigh 500 kB a plot); a viewer may then draw the text with a wider
// font than the one measured, so a margin keeps the labels at the right
// edge and the bottom inside the picture.
func save(p *plot.Plot, path string) error {
	c := vgsvg.New(8*vg.Inch, 4.5*vg.Inch)
	p.Draw(draw.Crop(draw.New(c), 0.05*vg.Inch, -0.3*vg.Inch, 0.05*vg.Inch, -0.05*vg.Inch))
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := c.WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
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
		p := plot.New()
		p.Title.Text = fig.title
		p.X.Label.Text = "jobs due at the same instant, on each replica"
		p.Y.Label.Text = fig.y
		p.X.Scale, p.Y.Scale = plot.LogScale{}, plot.LogScale{}
		p.X.Tick.Marker, p.Y.Tick.Marker = plot.LogTicks{Prec: -1}, plot.LogTicks{Prec: -1}
		p.Legend.Top = true
		p.Legend.Left = true
		byStyle := map[string]plotter.XYs{}
		var order []string
		for _, pt := range points {
			v := fig.value(pt)
			if v <= 0 {
				continue // unknown (CPU of a server in a container), or too small for a log scale
			}
			if _, ok := byStyle[pt.Style]; !ok {
				order = append(order, pt.Style)
			}
			byStyle[pt.Style] = append(byStyle[pt.Style], plotter.XY{X: float64(pt.Jobs), Y: v})
		}
		if len(order) == 0 {
			continue
		}
		var lines []any
		for _, style := range order {
			lines = append(lines, style, byStyle[style])
		}
		if err := plotutil.AddLinePoints(p, lines...); err != nil {
			return err
		}
		if err := save(p, filepath.Join(dir, fig.file)); err != nil {
			return err
		}
	}
	return nil
}
