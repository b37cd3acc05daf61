package stages

import (
	"encoding/json"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/engine"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
)

// testText is a small byte-level corpus with some structure to learn.
func testText(t *testing.T) *data.Text {
	t.Helper()
	var b strings.Builder
	for i := 0; b.Len() < 6000; i++ {
		fmt.Fprintf(&b, "func f%d(x int) int { return x * %d }\n", i%37, i%11)
	}
	text, err := data.NewText([]byte(b.String()), data.ByteTokenizer{}, 0.2)
	if err != nil {
		t.Fatal(err)
	}
	return text
}

// gptConfig is a tiny GPT (embed, 3 blocks, head: 5 layers) on text; layers[s]
// lists stage s's range per chunk.
func gptConfig(sched string, layers [][]string, tied bool) *configs.Config {
	c := &configs.Config{
		Model: models.Spec{Name: "gpt", DType: "float64", Layers: 3, Width: 8, Heads: 2, Context: 6, Vocab: 256, TieEmbeddings: tied},
		Data:  configs.Data{Dataset: "text", Corpus: "test", Tokenizer: "byte", ValFraction: 0.2, BatchSize: 8, MicroBatches: 4},
		Train: configs.Train{Steps: 4, Seed: 5, LogEvery: 2, Evaluate: true, EvalEvery: 2,
			Optimizer: configs.Optimizer{Name: "adam", LR: 0.01, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}},
		Schedule:      sched,
		VirtualStages: len(layers[0]),
		Compute:       configs.Compute{BLASThreads: 1},
		Transport:     configs.Transport{ConnectTimeout: time.Second, QueueDepth: 2, RecvTimeout: 20 * time.Second, Heartbeat: time.Second, PeerTimeout: time.Second},
		Checkpoint:    configs.Checkpoint{Keep: 2},
	}
	for i, l := range layers {
		c.Stages = append(c.Stages, configs.Stage{Layers: l, Address: fmt.Sprintf("127.0.0.1:%d", 7000+i), Device: "cpu"})
	}
	return c
}

// cnnConfig is a small CNN on 8x8 images: conv0, conv1, fc.
func cnnConfig(layers [][]string) *configs.Config {
	c := testConfig("1f1b", layers, 2, "float64", "sgd")
	c.Model = models.Spec{Name: "cnn", DType: "float64", Input: 64, Channels: []int{2, 3}, Classes: 3}
	return c
}

// sameRun requires bit-identical losses, evaluations and weights.
func sameRun(t *testing.T, ref, pipe string) {
	t.Helper()
	sameFile(t, filepath.Join(ref, "eval.json"), filepath.Join(pipe, "eval.json"))
	sameWeights(t, ref, pipe)
	mr, err1 := ReadMetrics(filepath.Join(ref, "metrics.jsonl"))
	mp, err2 := ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if len(mr) == 0 || len(mr) != len(mp) {
		t.Fatalf("%d and %d metric lines", len(mr), len(mp))
	}
	for i := range mr {
		if mr[i].Loss != mp[i].Loss || fmt.Sprint(mr[i].Eval) != fmt.Sprint(mp[i].Eval) {
			t.Errorf("step %d: reference loss %v eval %+v, pipeline %v %+v", mr[i].Step, mr[i].Loss, mr[i].Eval, mp[i].Loss, mp[i].Eval)
		}
	}
}

// TestGPTPipelineEqualsReference trains the GPT, tied and untied, split at
// different block boundaries, interleaved and under zero-bubble (interleaved-zb
// both), against the one-process reference.
func TestGPTPipelineEqualsReference(t *testing.T) {
	cases := []struct {
		sched  string
		layers [][]string
	}{
		{"1f1b", plain("0-1", "2-4")},
		{"gpipe", plain("0", "1-2", "3", "4")},
		{"interleaved", [][]string{{"0", "2-3"}, {"1", "4"}}},
		// Zero-bubble: every layer's weight passes run apart from its
		// input passes, from what those kept.
		{"zb-h1", plain("0-1", "2-4")},
		{"zb-h1", plain("0", "1-2", "3", "4")},
		// The V: embedding and head both on stage 0 (their tie is local).
		{"zb-v", [][]string{{"0", "4"}, {"1", "2-3"}}},
		{"dualpipev", [][]string{{"0", "4"}, {"1", "2-3"}}},
		// Interleaved with the weight passes split off, the tie over the ring.
		{"interleaved-zb", [][]string{{"0", "2-3"}, {"1", "4"}}},
	}
	for _, tied := range []bool{false, true} {
		for _, tc := range cases {
			t.Run(fmt.Sprintf("%s/p%d/tied=%v", tc.sched, len(tc.layers), tied), func(t *testing.T) {
				cfg := gptConfig(tc.sched, tc.layers, tied)
				ref := runInProcess(t, cfg, true)
				pipe, rts := runStages(t, cfg, false)
				sameRun(t, ref, pipe)
				for i, rt := range rts {
					for _, c := range rt.chunks {
						e := c.(*engine.Engine)
						if split := strings.HasPrefix(tc.sched, "zb-") || strings.HasSuffix(tc.sched, "-zb") || tc.sched == "dualpipev"; e.Split != split {
							t.Errorf("stage %d's engine for layers [%d, %d): split %v under %s", i, e.First, e.Last, e.Split, tc.sched)
						}
					}
				}
				ms, _ := ReadMetrics(filepath.Join(pipe, "metrics.jsonl"))
				if ms[1].Eval == nil || ms[1].Eval.Perplexity <= 1 || math.Abs(ms[1].Eval.Perplexity-math.Exp(ms[1].Eval.Loss)) > 1e-9 {
					t.Errorf("step 2 has no validation perplexity: %+v", ms[1].Eval)
				}
				// The final evaluation is logged with the last step as well as in eval.json.
				var final EvalResult
				if b, err := os.ReadFile(filepath.Join(pipe, "eval.json")); err != nil || json.Unmarshal(b, &final) != nil {
					t.Fatalf("eval.json: %v", err)
				}
				if last := ms[len(ms)-1]; last.Eval == nil || *last.Eval != final {
					t.Errorf("step %d's evaluation %+v, eval.json %+v", last.Step, last.Eval, final)
				}
				if tied {
					w := readWeights(t, pipe)
					a, b := w["embed.tok"], w["head.tok"]
					if len(a.F64) == 0 {
						t.Fatal("tied weights missing")
					}
					if err := checkpoint.DiffTensor(a, b); err != nil {
						t.Fatalf("tied copies differ after training%v", err)
					}
				}
			})
		}
	}
}

// TestTiedDiffersFromUntied guards the test above: tying must change training.
func TestTiedDiffersFromUntied(t *testing.T) {
	a := runInProcess(t, gptConfig("1f1b", plain("0-1", "2-4"), true), false)
	b := runInProcess(t, gptConfig("1f1b", plain("0-1", "2-4"), false), false)
	la, lb := readLosses(t, a), readLosses(t, b)
	if fmt.Sprint(la) == fmt.Sprint(lb) {
		t.Errorf("tied and untied runs have the same losses %v", la)
	}
}

// TestCNNPipelineEqualsReference splits the CNN at both boundaries.
func TestCNNPipelineEqualsReference(t *testing.T) {
	for _, split := range [][][]string{plain("0", "1-2"), plain("0-1", "2"), plain("0", "1", "2")} {
		t.Run(fmt.Sprint(split), func(t *testing.T) {
			cfg := cnnConfig(split)
			sameRun(t, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
		})
	}
}

// TestCompressedLinks runs a pipeline with 16-bit links: half the bytes on the
// wire, losses close to the float32 run's but not equal (the casts round).
func TestCompressedLinks(t *testing.T) {
	base := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	plainDir := runInProcess(t, base, false)
	want := readLosses(t, plainDir)
	sent := func(dir string) int64 {
		_, events, err := profile.ReadRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		var n int64
		for _, stage := range events {
			for _, e := range stage {
				n += e.BytesSent
			}
		}
		return n
	}
	full := sent(plainDir)
	for _, comp := range []string{"fp16", "bf16"} {
		t.Run(comp, func(t *testing.T) {
			c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
			c.Transport.Compression = comp
			dir := runInProcess(t, c, false)
			got := readLosses(t, dir)
			if fmt.Sprint(got) == fmt.Sprint(want) {
				t.Errorf("compressed losses equal the float32 run's exactly: %v", got)
			}
			for i := range got {
				if math.Abs(got[i]-want[i]) > 0.02*math.Abs(want[i]) {
					t.Errorf("step %d: loss %v with %s, %v without", i+1, got[i], comp, want[i])
				}
			}
			if n := sent(dir); 2*n != full {
				t.Errorf("%d bytes sent with %s, %d without; want half", n, comp, full)
			}
		})
	}
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float64", "adam")
	c.Transport.Compression = "bf16"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "transport.compression") {
		t.Errorf("bf16 on a float64 model: %v", err)
	}
}
