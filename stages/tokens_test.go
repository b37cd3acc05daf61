package stages

import (
	"encoding/binary"
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
)

// writeTokenShards writes testText's training tokens as two llm.c shards
// and its validation tokens as a nanoGPT file into dir, and returns the data
// section's own keys naming them.
func writeTokenShards(t *testing.T, dir string) map[string]any {
	t.Helper()
	text := testText(t)
	shard := func(name string, tokens []int32) {
		b := make([]byte, 1024)
		binary.LittleEndian.PutUint32(b[0:], 20240520)
		binary.LittleEndian.PutUint32(b[4:], 1)
		binary.LittleEndian.PutUint32(b[8:], uint32(len(tokens)))
		for _, v := range tokens {
			b = binary.LittleEndian.AppendUint16(b, uint16(v))
		}
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	half := len(text.Train) / 2
	shard("train_000.bin", text.Train[:half])
	shard("train_001.bin", text.Train[half:])
	var val []byte
	for _, v := range text.Val {
		val = binary.LittleEndian.AppendUint16(val, uint16(v))
	}
	if err := os.WriteFile(filepath.Join(dir, "val.bin"), val, 0o644); err != nil {
		t.Fatal(err)
	}
	return map[string]any{"train_shards": filepath.Join(dir, "train_*.bin"), "val_shards": filepath.Join(dir, "val.bin")}
}

// TestTokenShardsTrainLikeReference: a GPT fed from token files (dataset
// tokens: two llm.c shards, a nanoGPT validation file) trains pipelined bit
// for bit as its one-process reference does, evaluations included: both
// ends of the pipeline draw the same windows from the files.
func TestTokenShardsTrainLikeReference(t *testing.T) {
	for _, c := range []struct {
		name string
		cfg  *configs.Config
	}{
		{"1f1b", gptConfig("1f1b", plain("0-1", "2-4"), true)},
		{"interleaved", gptConfig("interleaved", [][]string{{"0", "2-3"}, {"1", "4"}}, true)},
	} {
		t.Run(c.name, func(t *testing.T) {
			cfg := c.cfg
			cfg.Data = configs.Data{Dataset: "tokens", BatchSize: 8, MicroBatches: 4, Own: writeTokenShards(t, t.TempDir())}
			ref := runInProcess(t, cfg, true)
			pipe := runInProcess(t, cfg, false)
			sameRun(t, ref, pipe)
			// Every validation window is scored, the last micro-batch's
			// padding not: (tokens-1)/context windows of context targets.
			b, err := os.ReadFile(filepath.Join(pipe, "eval.json"))
			if err != nil {
				t.Fatal(err)
			}
			var res EvalResult
			want := data.EvalWindows(int64(len(testText(t).Val)), cfg.Model.Context) * int64(cfg.Model.Context)
			if err := json.Unmarshal(b, &res); err != nil || int64(res.Examples) != want || res.Perplexity == 0 {
				t.Errorf("eval.json %s (%v): want %d tokens scored and a perplexity", b, err, want)
			}
		})
	}
}
