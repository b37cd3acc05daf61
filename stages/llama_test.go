package stages

import (
	"fmt"
	"testing"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// llamaConfig is gptConfig's run with a tiny Llama (embed, 3 blocks, head:
// 5 layers) of 4 query heads sharing kvHeads key and value heads.
func llamaConfig(sched string, layers [][]string, tied bool, kvHeads int) *configs.Config {
	c := gptConfig(sched, layers, tied)
	c.Model = models.Spec{Name: "llama", DType: "float64", Layers: 3, Width: 8, Heads: 4, Context: 6, Vocab: 256,
		TieEmbeddings: tied, Own: map[string]any{"intermediate": 12, "kv_heads": kvHeads}}
	return c
}

// TestLlamaPipelineEqualsReference trains the Llama, tied and untied, with
// grouped-query attention and without, pipelined under gpipe, 1f1b,
// interleaved and the zero-bubble schedules (whose weight passes rebuild the
// blocks' parts),
// some stages recomputing attention's probabilities (selective) or their
// whole forward (full), against the one-process reference, bit for bit.
func TestLlamaPipelineEqualsReference(t *testing.T) {
	cases := []struct {
		sched  string
		layers [][]string
		modes  []string
	}{
		{"gpipe", plain("0", "1-2", "3", "4"), nil},
		{"1f1b", plain("0-1", "2-4"), []string{"selective", ""}},
		{"zb-h1", plain("0-1", "2-4"), []string{"", "selective"}},
		// The V: embedding and head both on stage 0 (their tie is local).
		{"zb-v", [][]string{{"0", "4"}, {"1", "2-3"}}, []string{"full", "selective"}},
		// Interleaved, the tie over the ring, with and without split weight passes.
		{"interleaved", [][]string{{"0", "2-3"}, {"1", "4"}}, nil},
		{"interleaved-zb", [][]string{{"0", "2-3"}, {"1", "4"}}, []string{"full", ""}},
		{"dualpipev", [][]string{{"0", "4"}, {"1", "2-3"}}, nil},
	}
	for _, kv := range []int{2, 4} {
		for _, tied := range []bool{false, true} {
			for _, tc := range cases {
				t.Run(fmt.Sprintf("%s/p%d/tied=%v/kv=%d", tc.sched, len(tc.layers), tied, kv), func(t *testing.T) {
					cfg := llamaConfig(tc.sched, tc.layers, tied, kv)
					for i, m := range tc.modes {
						cfg.Stages[i].Recompute = m
					}
					ref := runInProcess(t, cfg, true)
					pipe := runInProcess(t, cfg, false)
					sameRun(t, ref, pipe)
					if tied {
						w := readWeights(t, pipe)
						if err := checkpoint.DiffTensor(w["embed.tok"], w["head.tok"]); err != nil || len(w["embed.tok"].F64) == 0 {
							t.Fatalf("tied copies differ after training%v", err)
						}
					}
				})
			}
		}
	}
}

// TestLlamaTrains: the tiny Llama's loss falls over a few steps, so the
// test above compares runs that learn.
func TestLlamaTrains(t *testing.T) {
	cfg := llamaConfig("1f1b", plain("0-1", "2-4"), true, 2)
	cfg.Train.Steps = 12
	losses := readLosses(t, runInProcess(t, cfg, true))
	if len(losses) < 2 || !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("losses %v do not fall", losses)
	}
}
