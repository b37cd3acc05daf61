// Package generate continues text with a trained language model: the whole
// model in one process, its weights from a run directory, one token at a
// time. It is separate from the training runtime, which it shares nothing
// with but the engine.
package generate

import (
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"os"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/runlog"
)

// Generator continues text with a trained language model, all its layers in one
// process: generation is one token at a time, so there is nothing to pipeline.
type Generator struct {
	engine  *engine.Engine
	tok     data.Tokenizer
	context int
	// From says which weights were loaded.
	From string
}

// New builds the config's model and loads a run's weights: its final
// weights, or if the run did not finish, its newest complete checkpoint.
// tokenizer names the tokenizer ("byte" or a tokenizer file, see
// data.LoadTokenizer); "" takes the data's: a text corpus's, or the one
// recorded beside a tokens run's training shards.
func New(c *configs.Config, runDir, tokenizer string) (*Generator, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, err
	}
	if model.Targets() == 1 {
		return nil, fmt.Errorf("%s: model %s is not a language model", c.Path, c.Model.Name)
	}
	tok, err := Tokenizer(c, tokenizer)
	if err != nil {
		return nil, err
	}
	if tok.Vocab() > c.Model.Vocab {
		return nil, fmt.Errorf("%s: the tokenizer has %d ids, more than model.vocab's %d", c.Path, tok.Vocab(), c.Model.Vocab)
	}
	e, err := engine.NewEngine(model, 0, len(model.Layers), 1, c.Train.Seed, engine.Options{})
	if err != nil {
		return nil, err
	}
	g := &Generator{engine: e, tok: tok, context: model.Example[0]}
	weights, from, err := runWeights(c, runDir)
	if err != nil {
		return nil, err
	}
	for _, p := range e.Params() {
		if err := checkpoint.CopyInto(weights, p.Name(), p.Shape(), p.Value().Data()); err != nil {
			return nil, fmt.Errorf("%s: %w", from, err)
		}
	}
	g.From = from
	return g, nil
}

// Tokenizer is the tokenizer name says ("byte" or a tokenizer file), or
// for "" the one the config's data was tokenized with: dataset text's
// (which tokenizes the corpus again) or the file beside dataset tokens'
// training shards.
func Tokenizer(c *configs.Config, name string) (data.Tokenizer, error) {
	switch name {
	case "byte":
		return data.ByteTokenizer{}, nil
	case "":
	default:
		return data.LoadTokenizer(name)
	}
	s := c.DataSection()
	switch s.Dataset {
	case "text":
		text, err := c.LoadText()
		if err != nil {
			return nil, err
		}
		return text.Tokenizer, nil
	case "tokens":
		tok, _, err := data.ShardTokenizer(s)
		if err != nil {
			return nil, fmt.Errorf("%w; give --tokenizer byte or a tokenizer.json", err)
		}
		return tok, nil
	}
	return nil, fmt.Errorf("%s: data.dataset %s records no tokenizer; give --tokenizer byte or a tokenizer.json", c.Path, s.Dataset)
}

// runWeights reads a run's final weights, or its newest complete checkpoint.
func runWeights(c *configs.Config, runDir string) (map[string]checkpoint.Tensor, string, error) {
	dir := runlog.WeightsDir(runDir)
	if entries, _ := os.ReadDir(dir); len(entries) > 0 {
		w, err := checkpoint.ReadAll(dir)
		return w, dir, err
	}
	m, _, err := checkpoint.Latest(runlog.CheckpointDir(runDir), c.TrainingDigest())
	if err != nil {
		return nil, "", err
	}
	if m == nil {
		return nil, "", fmt.Errorf("%s has no final weights and no complete checkpoint", runDir)
	}
	w, err := checkpoint.ReadAll(m.Dir)
	return w, m.Dir, err
}

// Generate appends n tokens to prompt, each drawn from the model's next-token
// distribution at the given temperature (0: always the most likely), with a
// generator seeded by seed so a sample can be repeated.
func (g *Generator) Generate(prompt []byte, n int, temperature float64, seed uint64) ([]byte, error) {
	ids, err := g.tok.Encode(prompt)
	if err != nil {
		return nil, fmt.Errorf("prompt: %w", err)
	}
	if len(ids) == 0 {
		return nil, errors.New("the prompt is empty")
	}
	rng := rand.New(rand.NewPCG(seed, 0))
	targets := make([]int, g.context)
	for range n {
		window := ids[max(0, len(ids)-g.context):]
		x := tensor.New(tensor.Of(g.engine.Model.DType), tensor.WithShape(1, g.context))
		for i, id := range window {
			// Positions after the window are padding: causal attention keeps
			// them from affecting the positions before.
			x.SetAt(castID(x.Dtype(), id), 0, i)
		}
		if _, err := g.engine.Forward(0, x, targets); err != nil {
			return nil, err
		}
		g.engine.Discard(0)
		logits, err := g.engine.Logits()
		if err != nil {
			return nil, err
		}
		vocab := logits.Shape()[1]
		// A model's vocabulary may be padded past the tokenizer's ids
		// (GPT-2's 50257 to 50304): only ids the tokenizer decodes are drawn.
		row := engine.Float64s(logits)[(len(window)-1)*vocab : (len(window)-1)*vocab+min(vocab, g.tok.Vocab())]
		ids = append(ids, int32(pick(row, temperature, rng)))
	}
	return g.tok.Decode(ids)
}

func castID(dt tensor.Dtype, id int32) any {
	if dt == tensor.Float64 {
		return float64(id)
	}
	return float32(id)
}

// pick draws an index from softmax(logits/temperature), or takes the argmax.
func pick(logits []float64, temperature float64, rng *rand.Rand) int {
	best := 0
	for i, v := range logits {
		if v > logits[best] {
			best = i
		}
	}
	if temperature <= 0 {
		return best
	}
	weights := make([]float64, len(logits))
	var z float64
	for i, v := range logits {
		weights[i] = math.Exp((v - logits[best]) / temperature)
		z += weights[i]
	}
	u := rng.Float64() * z
	for i, w := range weights {
		if u < w {
			return i
		}
		u -= w
	}
	return best
}
