package predict

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/stages"
)

// Costs are the simulator's per-stage costs in ms, with where they came
// from and which of them were not measured.
type Costs struct {
	schedule.Costs
	Source    string // where F and B (and I and W) came from
	IWAssumed string // why I and W are B/2 on the stages in IWStages; "" when measured or given
	IWStages  []bool
	BDerived  string // why B is I + W on the stages in BStages; "" when measured
	BStages   []bool

	// ChunkCosts is each stage's chunks' own costs, where they were measured or
	// taken from a run with the config's chunks; nil otherwise (each chunk
	// then costs a v-th of its stage). A V's chunks on one stage are the
	// model's first and last layers, not halves of one range.
	ChunkCosts [][]schedule.ChunkCost
	// Topology is the config's stages, chunks and placement: the schedules
	// whose chunks hold the layers ChunkCosts was measured on.
	Topology schedule.Topology

	// Sharing says which stages share cores (Costs.Cores), when some do.
	Sharing string

	RunTransfer       time.Duration // a run's measured mean link delay; 0 if none
	TransferFrom      string        // where Transfer came from, when it was not estimated
	TransferEstimated bool
}

// ResolveCosts returns per-stage action costs in ms, from what pipetrain
// simulate's --costs names: "measure" (each stage's chunks timed here, the
// median of reps runs, compute alone), a run directory (the mean of each
// action in its events: a forward's holds the time it waited for its data,
// runlog.Event.DataWaitNS, so the data a run read too slowly to hide is
// charged), or uniform costs f=F,b=B[,w=W]. Its Transfer is left for
// SetTransfer.
func ResolveCosts(cfg *configs.Config, model *models.Model, from string, reps int) (Costs, error) {
	p := len(cfg.Stages)
	c := Costs{
		Costs:    schedule.Costs{F: make([]float64, p), B: make([]float64, p), I: make([]float64, p), W: make([]float64, p)},
		IWStages: make([]bool, p),
		BStages:  make([]bool, p),
		Topology: cfg.Topology(),
	}
	switch {
	case from == "measure":
		reps = max(reps, 1)
		blas.SetThreads(cfg.Threads(0))
		measured, err := engine.MeasureCosts(cfg.Model, stages.EnginePipeline(cfg), reps)
		if err != nil {
			return c, err
		}
		for s, chunks := range measured {
			var own []schedule.ChunkCost
			for _, m := range chunks {
				c.F[s] += ms(m.F)
				c.B[s] += ms(m.B)
				c.I[s] += ms(m.I)
				c.W[s] += ms(m.W)
				own = append(own, schedule.ChunkCost{F: ms(m.F), B: ms(m.B), I: ms(m.I), W: ms(m.W)})
			}
			if len(chunks) > 1 {
				c.ChunkCosts = append(c.ChunkCosts, own)
			}
		}
		c.Source = fmt.Sprintf("measured on this machine, median of %d", reps)
		// Measured one stage at a time; in the run they compute at once,
		// sharing the cores of the machine or those they are pinned to.
		shared := StageCores(cfg)
		c.Cores, c.Sharing = shared.Groups, shared.Note
		if !Splittable(model) { // MeasureCosts could not time I and W apart
			c.IWAssumed = fmt.Sprintf("model %s cannot split its backward", cfg.Model.Name)
			c.IWStages = allStages(p)
		}
		return c, nil
	case strings.Contains(from, "="):
		u, err := parseUniform(from)
		if err != nil {
			return c, err
		}
		for s := range c.F {
			c.F[s], c.B[s], c.I[s], c.W[s] = u.f, u.b, u.b-u.w, u.w
		}
		c.Source = "given by --costs " + from
		if !u.wGiven {
			c.IWAssumed = "--costs gave no w=W"
			c.IWStages = allStages(p)
		}
		return c, nil
	}
	info, events, err := readCostsRun(from)
	if err != nil {
		return c, err
	}
	if info.Stages != p {
		return c, fmt.Errorf("--costs %s: the run had %d stages, %s has %d", from, info.Stages, cfg.Path, p)
	}
	if rep, err := profile.Analyse(info, events, 1); err == nil {
		c.RunTransfer, _ = rep.MeanTransfer()
	}
	run := "the run"
	c.Source = "from the events of " + from
	if info.Schedule != "" {
		run = "the " + info.Schedule + " run"
		c.Source += ", a " + info.Schedule + " run"
	}
	means := profile.MeanCosts(events, 1)
	sc := profile.ScheduleCosts(means, info.Chunks, 0)
	c.F, c.B, c.Gap = sc.F, sc.B, sc.Gap
	if info.Chunks == cfg.VirtualStages {
		c.ChunkCosts = sc.Chunks
	}
	if sc.I == nil { // not every stage split its backward: assume half each
		c.IWAssumed = run + " split no backward, so it timed no I or W"
		for s := range c.B {
			c.I[s], c.W[s] = c.B[s]/2, c.B[s]/2
			c.IWStages[s] = true
			if means[s].I > 0 { // MeanCosts gave this stage B = I + W
				c.BStages[s] = true
				c.IWAssumed = run + " did not split the backward on every stage"
				c.BDerived = run + " split the backward on that stage, so it timed no whole one"
			}
		}
		return c, nil
	}
	c.I, c.W = sc.I, sc.W
	c.BDerived = run + " split every backward, so it timed no whole one"
	c.BStages = allStages(p)
	return c, nil
}

// ForSchedule returns the costs to simulate s with: the chunks' own costs
// where s runs the config's chunks in the config's placement, and per-stage
// costs otherwise (a what-if with other chunks, or interleaved on a V's
// config, would place the layers otherwise).
func (c Costs) ForSchedule(s *schedule.Schedule) schedule.Costs {
	out := c.Costs
	if c.ChunkCosts != nil && s.Chunks > 1 && s.Topology() == c.Topology {
		out.Chunks = c.ChunkCosts
	}
	return out
}

// readCostsRun reads the run directory --costs names, saying what --costs
// expects when it is not one.
func readCostsRun(dir string) (profile.RunInfo, [][]profile.Event, error) {
	want := `want "measure", a run directory (pipetrain launch --run-dir) or f=F,b=B[,w=W] in ms`
	st, err := os.Stat(dir)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return profile.RunInfo{}, nil, fmt.Errorf("--costs %s: no such file or directory; %s", dir, want)
	case err != nil:
		return profile.RunInfo{}, nil, fmt.Errorf("--costs %s: %w", dir, err)
	case !st.IsDir():
		return profile.RunInfo{}, nil, fmt.Errorf("--costs %s: not a directory; %s", dir, want)
	}
	if _, err := os.Stat(filepath.Join(dir, "run.json")); errors.Is(err, fs.ErrNotExist) {
		return profile.RunInfo{}, nil, fmt.Errorf("--costs %s: not a run directory (it has no run.json); %s", dir, want)
	}
	info, events, err := profile.ReadRun(dir)
	if err != nil {
		return info, nil, fmt.Errorf("--costs %s: %w", dir, err)
	}
	return info, events, nil
}

func allStages(p int) []bool {
	out := make([]bool, p)
	for i := range out {
		out[i] = true
	}
	return out
}

// uniform is --costs f=F,b=B[,w=W].
type uniform struct {
	f, b, w float64
	wGiven  bool
}

func parseUniform(s string) (uniform, error) {
	u := uniform{w: -1}
	for _, kv := range strings.Split(s, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(kv), "=")
		x, err := strconv.ParseFloat(v, 64)
		if !ok || err != nil || x < 0 {
			return uniform{}, fmt.Errorf("--costs %q: write f=F,b=B[,w=W] with non-negative ms", s)
		}
		switch strings.ToLower(k) {
		case "f":
			u.f = x
		case "b":
			u.b = x
		case "w":
			u.w, u.wGiven = x, true
		default:
			return uniform{}, fmt.Errorf("--costs %q: unknown key %q (f, b, w)", s, k)
		}
	}
	if !u.wGiven {
		u.w = u.b / 2
	}
	if u.f <= 0 || u.b <= 0 || u.w > u.b {
		return uniform{}, fmt.Errorf("--costs %q: need f > 0, b > 0 and w <= b", s)
	}
	return u, nil
}

// SetTransfer sets c.Transfer, the time to move one activation between
// stages: given when there is one (simulate's --transfer), else the mean
// link delay the run of c measured, else estimated from the largest
// activation's size (schedule.Loopback), which TransferEstimated marks.
func (c *Costs) SetTransfer(cfg *configs.Config, model *models.Model, given *time.Duration) {
	switch {
	case given != nil:
		c.Transfer, c.TransferFrom = ms(*given), "given by --transfer"
	case c.RunTransfer > 0:
		c.Transfer, c.TransferFrom = ms(c.RunTransfer), "the run's measured mean link delay"
	default:
		c.Transfer, c.TransferEstimated = ms(engine.EstimateTransfer(stages.EnginePipeline(cfg), model)), true
	}
}

// Splittable reports whether every layer of m can split its backward into
// input and weight gradients, as the zero-bubble schedules need.
func Splittable(m *models.Model) bool {
	for _, l := range m.Layers {
		if _, ok := l.(models.Splittable); !ok {
			return false
		}
	}
	return true
}

func ms(d time.Duration) float64 { return float64(d) / 1e6 }
