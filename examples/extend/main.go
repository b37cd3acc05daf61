// Command extend shows pipetrain's seams from outside its packages: it
// registers a model family of its own (scaled-mlp: Dense layers built with
// models.NewDense around a layer type the program defines), a dataset kind
// of its own (blobs: Gaussian blobs made from the seed, no files) and a
// compute device of its own (metered: the cpu engine, counting the chunks
// it opens on each device index), trains a 2-stage pipeline of
// them over loopback with stages.RunProcess,
// as two pipetrain stage processes would, trains the same model in one
// process as pipetrain reference does, and compares the two runs' losses,
// evaluation and final weights bit for bit. It prints what it compared and
// exits 1 on any difference.
//
// docs/extending.md walks through it.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/stages"
	G "gorgonia.org/gorgonia"
	"gorgonia.org/tensor"
)

func init() {
	models.Register(scaledMLP{})
	data.Register(blobs{})
	compute.Register(meter)
}

// scaledMLP is the model family "scaled-mlp": a Dense layer per width of
// model.hidden (tanh), a learned per-feature scale after the first, and a
// Dense layer of logits. Its own key model.gain is the scale's initial value.
type scaledMLP struct{}

func (scaledMLP) Name() string { return "scaled-mlp" }

func (scaledMLP) Doc() models.FamilyDoc {
	return models.FamilyDoc{Summary: "Dense layers with a learned scale", Keys: []models.KeyDoc{
		{Key: "input", Doc: "Features of an example."},
		{Key: "hidden", Doc: "Widths of the hidden Dense layers; the scale follows the first."},
		{Key: "classes", Doc: "Classes predicted."},
		{Key: "gain", Type: "number", Doc: "The scale's initial value (1 when not given)."},
	}}
}

// Build validates the model section, naming every key at fault, and
// composes the layers.
func (scaledMLP) Build(spec models.Spec) (*models.Model, error) {
	var errs models.SpecErrors
	if spec.Input < 1 {
		errs = append(errs, models.SpecError{Field: "input", Msg: fmt.Sprintf("must be at least 1, got %d", spec.Input)})
	}
	if len(spec.Hidden) == 0 {
		errs = append(errs, models.SpecError{Field: "hidden", Msg: "no widths; scaled-mlp needs at least one"})
	}
	if spec.Classes < 2 {
		errs = append(errs, models.SpecError{Field: "classes", Msg: fmt.Sprintf("must be at least 2, got %d", spec.Classes)})
	}
	dt, err := models.ParseDType(spec.DType)
	if err != nil {
		errs = append(errs, models.SpecError{Field: "dtype", Msg: err.Error()})
	}
	own := struct {
		Gain *float64 `json:"gain"`
	}{}
	var ownErrs models.SpecErrors
	if errors.As(models.DecodeOwn(spec, &own), &ownErrs) {
		errs = append(errs, ownErrs...)
	}
	if len(errs) > 0 {
		return nil, errs
	}
	gain := 1.0
	if own.Gain != nil {
		gain = *own.Gain
	}
	var layers []models.Layer
	in := spec.Input
	for i, width := range spec.Hidden {
		d, err := models.NewDense(models.DenseSpec{Name: fmt.Sprintf("fc%d", i), In: in, Out: width, Activation: "tanh", DType: dt})
		if err != nil {
			return nil, err
		}
		layers = append(layers, d)
		if i == 0 {
			layers = append(layers, &scale{name: "scale", n: width, gain: gain, dt: dt})
		}
		in = width
	}
	out, err := models.NewDense(models.DenseSpec{Name: "out", In: in, Out: spec.Classes, DType: dt})
	if err != nil {
		return nil, err
	}
	layers = append(layers, out)
	return &models.Model{Spec: spec, DType: dt, Example: tensor.Shape{spec.Input}, Classes: spec.Classes, Layers: layers}, nil
}

// scale is y = x ⊙ s, s one learned factor per feature: a layer type
// pipetrain does not have. PyTorch would hold s as "scale.s".
type scale struct {
	name string
	n    int
	gain float64
	dt   tensor.Dtype
}

func (l *scale) Name() string                          { return l.name }
func (l *scale) OutShape(in tensor.Shape) tensor.Shape { return in.Clone() }

// Build adds the product to g. Every stage that builds the layer starts s at
// the same value, so the reference and the pipeline agree without a seed.
func (l *scale) Build(g *G.ExprGraph, x *G.Node, seed uint64) (models.Built, error) {
	init := tensor.New(tensor.Of(l.dt), tensor.WithShape(l.n))
	for i := range l.n {
		var v any = l.gain
		if l.dt == tensor.Float32 {
			v = float32(l.gain)
		}
		if err := init.SetAt(v, i); err != nil {
			return models.Built{}, fmt.Errorf("layer %s: %w", l.name, err)
		}
	}
	s := G.NewVector(g, l.dt, G.WithShape(l.n), G.WithName(l.name+".s"), G.WithValue(init))
	y, err := G.BroadcastHadamardProd(x, s, nil, []byte{0})
	if err != nil {
		return models.Built{}, fmt.Errorf("layer %s: %w", l.name, err)
	}
	return models.Built{Out: y, Params: []*G.Node{s}}, nil
}

// TorchParams gives the layer's PyTorch names, which export writes.
func (l *scale) TorchParams() []models.TorchParam {
	return []models.TorchParam{{Name: l.name + ".s", Torch: l.name + ".s", Shape: []int{l.n}}}
}

// blobs is the dataset kind "blobs": one Gaussian blob per class around a
// corner of the cube [-1, 1]^features, drawn from train.seed, so that every
// process that opens it draws the same examples. Its own keys are
// data.examples (training examples, 512 by default) and data.spread (the
// blobs' standard deviation, 0.5 by default).
type blobs struct{}

func (blobs) Name() string { return "blobs" }

func (blobs) Keys() []data.KeyDoc {
	return []data.KeyDoc{
		{Key: "examples", Type: "integer", Doc: "Training examples the blobs hold (512 when not given)."},
		{Key: "spread", Type: "number", Doc: "Standard deviation of each blob (0.5 when not given)."},
	}
}

type blobKeys struct {
	Examples int     `json:"examples"`
	Spread   float64 `json:"spread"`
}

// keys decodes the kind's own keys over their defaults.
func keys(s *data.Section, problem func(key, format string, args ...any)) blobKeys {
	k := blobKeys{Examples: 512, Spread: 0.5}
	s.DecodeOwn(&k, problem)
	return k
}

// Validate refuses a model that predicts tokens and keys the blobs cannot
// serve; it reads no file, as there is none.
func (blobs) Validate(s *data.Section, m *data.Model, problem func(key, format string, args ...any)) {
	if m != nil && m.Targets != 1 {
		problem("data.dataset", "blobs are labelled examples; model %s predicts tokens", m.Name)
	}
	k := keys(s, problem)
	if k.Examples < s.BatchSize {
		problem("data.examples", "%d examples hold no batch of %d", k.Examples, s.BatchSize)
	}
	if k.Spread <= 0 {
		problem("data.spread", "must be positive, got %v", k.Spread)
	}
}

// Check has nothing to read: the blobs are made, not loaded.
func (blobs) Check(s *data.Section, m *data.Model) error { return nil }

// Open draws the training blobs and an evaluation set of four micro-batches
// from the seed: the same corners, other noise.
func (blobs) Open(s *data.Section, m *data.Model, o data.OpenOptions) (data.Source, error) {
	k := keys(s, func(key, format string, args ...any) {})
	train := draw(s.Seed, trainNoise, k.Examples, m.Features(), m.Classes, k.Spread)
	test := draw(s.Seed, testNoise, 4*s.MicroBatch, m.Features(), m.Classes, k.Spread)
	sampler, err := data.NewSampler(s.Seed, train.N, s.BatchSize)
	if err != nil {
		return nil, fmt.Errorf("%s: blobs: %w", s.Config, err)
	}
	return &blobSource{train: train, test: test, sampler: sampler, batch: s.MicroBatch}, nil
}

// The streams of the seed's generator: the corners are one for both splits.
const (
	cornerStream = iota + 1
	trainNoise
	testNoise
)

// draw makes n examples of dim features: example i is of class i mod
// classes, at its class's corner plus N(0, spread²) noise from the given
// stream of the seed.
func draw(seed, stream uint64, n, dim, classes int, spread float64) *data.Dataset {
	corners := rand.New(rand.NewPCG(seed, cornerStream))
	corner := make([]float32, classes*dim)
	for i := range corner {
		corner[i] = float32(2*corners.IntN(2) - 1)
	}
	noise := rand.New(rand.NewPCG(seed, stream))
	d := &data.Dataset{Name: "blobs", N: n, Dim: dim, Classes: classes, Images: make([]float32, n*dim), Labels: make([]uint8, n)}
	for i := range n {
		c := i % classes
		d.Labels[i] = uint8(c)
		for j := range dim {
			d.Images[i*dim+j] = corner[c*dim+j] + float32(noise.NormFloat64()*spread)
		}
	}
	return d
}

// blobSource serves a stage's batches: rows of the training set chosen by
// the sampler for (step, micro-batch), and the evaluation set in order.
type blobSource struct {
	train, test *data.Dataset
	sampler     *data.Sampler
	batch       int
}

func (b *blobSource) Train(step, mb int, x data.Inputs, targets bool) []int {
	return fill(b.train, b.sampler.Indices(step)[mb*b.batch:(mb+1)*b.batch], x, targets)
}

func (b *blobSource) EvalBatches() int { return b.test.N / b.batch }

func (b *blobSource) Eval(k int, x data.Inputs, targets bool) ([]int, int) {
	rows := make([]int, b.batch)
	for i := range rows {
		rows[i] = k*b.batch + i
	}
	return fill(b.test, rows, x, targets), b.batch
}

func (b *blobSource) EvalName() string { return "test" }
func (b *blobSource) NextToken() bool  { return false }

// fill copies rows of d into x, in whichever dtype the stage reads, and
// returns their labels when the stage scores them.
func fill(d *data.Dataset, rows []int, x data.Inputs, targets bool) []int {
	for i, r := range rows {
		for j, v := range d.Images[r*d.Dim : (r+1)*d.Dim] {
			switch {
			case x.F32 != nil:
				x.F32[i*d.Dim+j] = v
			case x.F64 != nil:
				x.F64[i*d.Dim+j] = float64(v)
			}
		}
	}
	if !targets {
		return nil
	}
	y := make([]int, len(rows))
	data.GatherLabels(d, rows, y)
	return y
}

// metered is the device kind "metered": it computes on the cpu device
// pipetrain registers and counts the chunks it opens. It hands back the cpu
// device's Stage unwrapped: replicas and tied weights still reach a chunk's
// weights in the cpu engine's graph, so a stage's runtime refuses a Stage
// that neither is nor holds the cpu engine.
type metered struct {
	mu      sync.Mutex
	indices []int // the device index of each chunk opened, in order
}

var meter = &metered{}

func (*metered) Kind() string { return "metered" }

// opened is the device indices of the chunks opened, sorted: the stages
// open theirs at once.
func (m *metered) opened() []int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(slices.Values(m.indices))
}

// Open opens model stages [spec.First, spec.Last) on the cpu device and
// counts them; spec.Index is N of stages[i].device "metered:N".
func (m *metered) Open(spec compute.Spec) (compute.Stage, error) {
	cpu, _, err := compute.Lookup("cpu")
	if err != nil {
		return nil, err
	}
	st, err := cpu.Open(spec)
	if err != nil {
		return nil, fmt.Errorf("metered:%d: %w", spec.Index, err)
	}
	m.mu.Lock()
	m.indices = append(m.indices, spec.Index)
	m.mu.Unlock()
	return st, nil
}

// config is the run: the family and the kind above, by the names they
// registered, split over two stages (the scale on stage 0) that compute on
// the metered device. ADDR0 and ADDR1 become free loopback addresses.
const config = `name: extend-example
model:
  name: scaled-mlp
  dtype: float32
  input: 16
  hidden: [24, 12]
  classes: 4
  gain: 0.8
data:
  dataset: blobs
  examples: 256
  spread: 0.6
  batch_size: 32
  micro_batches: 4
train:
  steps: 20
  seed: 7
  log_every: 1
  evaluate: true
  optimizer: {name: adam, lr: 0.01}
compute:
  blas_threads: 1
schedule: 1f1b
stages:
  - {layers: "0-1", address: ADDR0, device: metered}
  - {layers: "2-3", address: ADDR1, device: "metered:1"}
`

func main() {
	perturb := flag.Bool("perturb", false, "train the reference with a learning rate 1% higher, to see the comparison fail")
	flag.Parse()
	if err := run(context.Background(), os.Stdout, *perturb); err != nil {
		fmt.Fprintln(os.Stderr, "extend:", err)
		os.Exit(1)
	}
}

// run trains the reference and the pipeline in temporary run directories
// and compares them.
func run(ctx context.Context, out io.Writer, perturb bool) error {
	dir, err := os.MkdirTemp("", "pipetrain-extend-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg, err := load(dir)
	if err != nil {
		return err
	}
	refCfg := cfg
	if perturb {
		if refCfg, err = load(dir); err != nil {
			return err
		}
		refCfg.Train.Optimizer.LR *= 1.01
	}
	ref, pipe := filepath.Join(dir, "reference"), filepath.Join(dir, "pipeline")
	if err := reference(ctx, refCfg, ref); err != nil {
		return err
	}
	if err := pipeline(ctx, cfg, pipe); err != nil {
		return err
	}
	opened := meter.opened()
	if !slices.Equal(opened, []int{0, 1}) {
		return fmt.Errorf("the metered device opened chunks on devices %v; want stage 0's on metered:0 and stage 1's on metered:1", opened)
	}
	return compare(out, ref, pipe)
}

// load writes the config with two free loopback addresses into dir and
// loads it, which validates it through the family and the kind.
func load(dir string) (*configs.Config, error) {
	text := config
	for i := range 2 {
		addr, err := freeAddress()
		if err != nil {
			return nil, err
		}
		text = strings.Replace(text, fmt.Sprintf("ADDR%d", i), addr, 1)
	}
	path := filepath.Join(dir, "extend.yaml")
	if err := os.WriteFile(path, []byte(text), 0o600); err != nil {
		return nil, err
	}
	return configs.Load(path)
}

// freeAddress is a loopback address whose port was free a moment ago.
func freeAddress() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}

// reference trains the whole model in one runtime, as pipetrain reference
// does, on the cpu device.
func reference(ctx context.Context, cfg *configs.Config, runDir string) error {
	var log bytes.Buffer
	stages.SetProcessThreads(cfg.ReferenceThreads())
	rt, err := stages.New(stages.Options{Config: cfg, Reference: true, RunDir: runDir, Log: &log, Threads: cfg.ReferenceThreads()})
	if err == nil {
		err = rt.Run(ctx)
	}
	if err != nil {
		return fmt.Errorf("reference: %w\n%s", err, log.String())
	}
	return nil
}

// pipeline runs both stages as pipetrain stage would, each in a goroutine,
// linked over loopback.
func pipeline(ctx context.Context, cfg *configs.Config, runDir string) error {
	logs := make([]bytes.Buffer, len(cfg.Stages))
	errs := make([]error, len(cfg.Stages))
	var wg sync.WaitGroup
	for i := range cfg.Stages {
		wg.Go(func() {
			errs[i] = stages.RunProcess(ctx, stages.ProcessOptions{Config: cfg, Stage: i, RunDir: runDir, Log: &logs[i]})
		})
	}
	wg.Wait()
	for i, err := range errs {
		if err != nil {
			return fmt.Errorf("stage %d: %w\n%s", i, err, logs[i].String())
		}
	}
	return nil
}

// compare holds the pipeline's run directory to the reference's: every
// step's loss, the evaluation and every final weight, bit for bit.
func compare(out io.Writer, ref, pipe string) error {
	mr, err := stages.ReadMetrics(filepath.Join(ref, "metrics.jsonl"))
	if err != nil {
		return err
	}
	mp, err := stages.ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
	if err != nil {
		return err
	}
	var diffs []string
	if len(mr) == 0 || len(mr) != len(mp) {
		diffs = append(diffs, fmt.Sprintf("%d metric lines in the reference, %d in the pipeline", len(mr), len(mp)))
	}
	for i := range min(len(mr), len(mp)) {
		if math.Float64bits(mr[i].Loss) != math.Float64bits(mp[i].Loss) {
			diffs = append(diffs, fmt.Sprintf("step %d: loss %v in the reference, %v in the pipeline", mr[i].Step, mr[i].Loss, mp[i].Loss))
		}
	}
	er, err := os.ReadFile(filepath.Join(ref, "eval.json"))
	if err != nil {
		return err
	}
	ep, err := os.ReadFile(filepath.Join(pipe, "eval.json"))
	if err != nil {
		return err
	}
	if !bytes.Equal(er, ep) {
		diffs = append(diffs, fmt.Sprintf("evaluation %s in the reference, %s in the pipeline", compact(er), compact(ep)))
	}
	wr, err := checkpoint.ReadAll(filepath.Join(ref, "weights"))
	if err != nil {
		return err
	}
	wp, err := checkpoint.ReadAll(filepath.Join(pipe, "weights"))
	if err != nil {
		return err
	}
	if err := checkpoint.Diff(wr, wp); err != nil {
		diffs = append(diffs, "weights: "+err.Error())
	}
	if len(diffs) > 0 {
		return fmt.Errorf("the 2-stage pipeline differs from its reference:\n  %s", strings.Join(diffs, "\n  "))
	}
	var eval stages.EvalResult
	if err := json.Unmarshal(er, &eval); err != nil {
		return fmt.Errorf("%s: %w", filepath.Join(ref, "eval.json"), err)
	}
	first, last := mr[0], mr[len(mr)-1]
	fmt.Fprintf(out, "scaled-mlp on blobs, 2 stages over loopback: loss %.4f at step %d, %.4f at step %d; test accuracy %.4f of %d examples\n",
		first.Loss, first.Step, last.Loss, last.Step, eval.Accuracy, eval.Examples)
	fmt.Fprintf(out, "the metered device opened chunks on devices %v\n", meter.opened())
	fmt.Fprintf(out, "equal to the one-process reference bit for bit: %d losses, the evaluation, %d weight tensors\n", len(mr), len(wr))
	return nil
}

// compact is a JSON document on one line, for a message.
func compact(b []byte) string {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return string(bytes.TrimSpace(b))
	}
	return buf.String()
}
