package engine

import (
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"

	G "gorgonia.org/gorgonia"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// TestSplitStashBytesIsTheStash: what splitStashBytes predicts is what a
// split engine keeps of a micro-batch between its input and weight passes,
// byte for byte; for the MLP it is the fused estimate, for GPT blocks ten
// times that.
func TestSplitStashBytesIsTheStash(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	mlp := smallMLP(t, "float32")
	gpt := smallGPT(t, "float64", true)
	const batch = 3
	for _, c := range []struct {
		m           *models.Model
		first, last int
	}{{mlp, 0, 3}, {mlp, 1, 2}, {gpt, 0, 4}, {gpt, 0, 1}, {gpt, 1, 3}, {gpt, 3, 4}} {
		e, err := NewEngine(c.m, c.first, c.last, batch, 1, true)
		if err != nil {
			t.Fatal(err)
		}
		x := randomDense(r, c.m.DType, e.InShape())
		if c.first == 0 && c.m.Targets() > 1 {
			x = randomTokens(r, c.m.DType, e.InShape(), c.m.Classes)
		}
		targets := make([]int, batch*c.m.Targets())
		var grad G.Value = e.LossScale(1)
		if !e.IsLast() {
			grad = randomDense(r, c.m.DType, e.OutShape())
		}
		if _, err := e.Forward(0, x, targets); err != nil {
			t.Fatal(err)
		}
		if _, err := e.Input(0, grad); err != nil {
			t.Fatal(err)
		}
		var kept int64
		for _, v := range e.flights[0].stash {
			kept += int64(v.MemSize())
		}
		want, err := splitStashBytes(c.m, c.first, c.last, batch)
		if err != nil {
			t.Fatal(err)
		}
		if kept != want {
			t.Errorf("%s layers [%d, %d): the stash holds %d bytes, predicted %d", c.m.Spec.Name, c.first, c.last, kept, want)
		}
		fused := stashBytes(c.m, c.first, c.last, batch)
		switch {
		case c.m == mlp && want != fused:
			t.Errorf("mlp layers [%d, %d): split stash %d bytes, fused estimate %d", c.first, c.last, want, fused)
		case c.m == gpt && c.first == 1 && want != 10*fused:
			t.Errorf("gpt blocks [%d, %d): split stash %d bytes, want 10 times the fused estimate %d", c.first, c.last, want, fused)
		}
	}
}

// TestStashBytesOfSplitSchedules: under a schedule that splits the backward
// a GPT stage is charged its split stash, an MLP stage what it always was.
func TestStashBytesOfSplitSchedules(t *testing.T) {
	for _, c := range []struct {
		model, data, stage1 string
		grows               bool // stage 1's split stash exceeds the fused estimate
	}{
		{"{name: mlp, input: 8, hidden: [6, 5], classes: 3}", "{batch_size: 12, micro_batches: 4}", "1-2", false},
		{"{name: gpt, layers: 2, width: 16, heads: 2, context: 8, vocab: 256}",
			`{dataset: text, corpus: "go:strings", tokenizer: byte, val_fraction: 0.1, batch_size: 4, micro_batches: 2}`, "1-3", true},
	} {
		p := filepath.Join(t.TempDir(), "run.yaml")
		text := "model: " + c.model + "\ndata: " + c.data + `
train: {steps: 1, optimizer: {name: sgd, lr: 0.1}}
schedule: zb-h1
stages:
  - {layers: "0", address: 127.0.0.1:7001}
  - {layers: "` + c.stage1 + `", address: 127.0.0.1:7002}
`
		if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
			t.Fatal(err)
		}
		cfg, err := configs.Load(p)
		if err != nil {
			t.Fatal(err)
		}
		m, err := models.Build(cfg.Model)
		if err != nil {
			t.Fatal(err)
		}
		fused, err := StashBytes(cfg, m, false)
		if err != nil {
			t.Fatal(err)
		}
		split, err := StashBytes(cfg, m, true)
		if err != nil {
			t.Fatal(err)
		}
		for s := range fused {
			first, last := cfg.ChunkLayers(s, 0)
			kept, err := splitStashBytes(m, first, last, cfg.MicroBatchSize())
			if err != nil {
				t.Fatal(err)
			}
			if want := max(fused[s], kept); split[s] != want {
				t.Errorf("%s stage %d: split stash %d bytes, want %d", cfg.Model.Name, s, split[s], want)
			}
			if grows := split[s] > fused[s]; s == 1 && grows != c.grows {
				t.Errorf("%s stage %d: split stash %d bytes, fused %d", cfg.Model.Name, s, split[s], fused[s])
			}
		}
	}
}
