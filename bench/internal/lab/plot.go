package lab

import (
	"os"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgsvg"
)

// NewPlot is a plot with its title, axis labels and the legend at the top
// left, where the lines of the studies leave room.
func NewPlot(title, x, y string) *plot.Plot {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = x
	p.Y.Label.Text = y
	p.Legend.Top = true
	p.Legend.Left = true
	return p
}

// SaveSVG writes p as an SVG of 8x4.5 inches. The fonts are not embedded
// (that would weigh 500 kB a plot); a viewer may then draw the text with a
// wider font than the one measured, so a margin keeps the labels at the
// right edge and the bottom inside the picture.
func SaveSVG(p *plot.Plot, path string) error {
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
