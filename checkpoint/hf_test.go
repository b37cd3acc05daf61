package checkpoint

import (
	"encoding/json"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/models"
)

func TestHalfConversions(t *testing.T) {
	for _, c := range []struct {
		v    float32
		f16  uint16
		bf16 uint16
	}{
		{1, 0x3c00, 0x3f80},
		{-2, 0xc000, 0xc000},
		{65504, 0x7bff, 0x477f + 1}, // 65504 rounds up to 65536 in bfloat16
		{float32(math.Ldexp(1, -24)), 0x0001, 0x3380},
		{0.1, 0x2e66, 0x3dcd},
		{1e6, 0x7c00, 0x4974},
	} {
		if got := F32ToF16(c.v); got != c.f16 {
			t.Errorf("F32ToF16(%g) = %#04x, want %#04x", c.v, got, c.f16)
		}
		if got := F32ToBF16(c.v); got != c.bf16 {
			t.Errorf("F32ToBF16(%g) = %#04x, want %#04x", c.v, got, c.bf16)
		}
	}
	// Every half and bfloat16 widens and narrows back to itself.
	for h := range 1 << 16 {
		if f := F16ToF32(uint16(h)); f == f && F32ToF16(f) != uint16(h) {
			t.Fatalf("half %#04x widens to %g, which narrows to %#04x", h, f, F32ToF16(f))
		}
		if f := BF16ToF32(uint16(h)); f == f && F32ToBF16(f) != uint16(h) {
			t.Fatalf("bfloat16 %#04x widens to %g, which narrows to %#04x", h, f, F32ToBF16(f))
		}
	}
}

// hfModel builds a tiny model of family name.
func hfModel(t *testing.T, name string, tied bool) *models.Model {
	t.Helper()
	spec := models.Spec{Name: name, DType: "float32", Layers: 2, Width: 8, Heads: 2, Context: 4, Vocab: 16, TieEmbeddings: tied}
	if name == "llama" {
		spec.Own = map[string]any{"intermediate": 12, "kv_heads": 1}
	}
	m, err := models.Build(spec)
	if err != nil {
		t.Fatal(err)
	}
	return m
}

// randomHFWeights gives every parameter of m random values (tied copies
// equal), by pipetrain name.
func randomHFWeights(t *testing.T, m *models.Model) map[string]Tensor {
	t.Helper()
	ps, err := models.HFParams(m)
	if err != nil {
		t.Fatal(err)
	}
	r := rand.New(rand.NewPCG(1, 2))
	out := map[string]Tensor{}
	byHF := map[string]string{}
	for _, p := range ps {
		if p.Copy {
			c := out[byHF[p.HF]]
			c.Name = p.Name
			out[p.Name] = c
			continue
		}
		n := 1
		for _, d := range p.Shape {
			n *= d
		}
		v := make([]float32, n)
		for i := range v {
			v[i] = float32(r.NormFloat64())
		}
		out[p.Name] = Tensor{Name: p.Name, Shape: p.Shape, F32: v}
		byHF[p.HF] = p.Name
	}
	return out
}

// writeHF writes m's weights w as a Hugging Face directory in dtype.
func writeHF(t *testing.T, m *models.Model, w map[string]Tensor, dtype string, shardSize int64) string {
	t.Helper()
	ps, err := models.HFParams(m)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := ToHF(ps, w, func(string) string { return dtype })
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := models.HFConfig(m, nil, "float32")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hf")
	if _, err := WriteHFDir(dir, cfg, raw, shardSize); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestHFDirRoundTrip writes each model's weights as a Hugging Face
// directory (GPT-2's q, k and v fused into c_attn, Llama's projections
// transposed), sharded and not, and reads them back: F32 exactly, BF16
// and F16 as each value rounded.
func TestHFDirRoundTrip(t *testing.T) {
	for _, name := range []string{"llama", "gpt"} {
		for _, tied := range []bool{false, true} {
			m := hfModel(t, name, tied)
			w := randomHFWeights(t, m)
			for _, c := range []struct {
				dtype string
				shard int64
				round func(float32) float32
			}{
				{"F32", 1 << 30, func(v float32) float32 { return v }},
				{"BF16", 300, func(v float32) float32 { return BF16ToF32(F32ToBF16(v)) }},
				{"F16", 1000, func(v float32) float32 { return F16ToF32(F32ToF16(v)) }},
			} {
				dir := writeHF(t, m, w, c.dtype, c.shard)
				_, sharded := os.Stat(filepath.Join(dir, HFIndexName))
				if (sharded == nil) != (c.shard < 1<<30) {
					t.Errorf("%s %s: index written %v, shard size %d", name, c.dtype, sharded == nil, c.shard)
				}
				if err := CheckHF(m, dir); err != nil {
					t.Fatalf("%s %s: %v", name, c.dtype, err)
				}
				got, err := ReadHF(m, dir, nil)
				if err != nil {
					t.Fatalf("%s %s: %v", name, c.dtype, err)
				}
				for n, want := range w {
					for i, v := range want.F32 {
						if g := got[n].F32[i]; g != c.round(v) {
							t.Fatalf("%s tied=%v %s: %s[%d] = %g, want %g", name, tied, c.dtype, n, i, g, c.round(v))
						}
					}
				}
			}
		}
	}
}

// TestReadHFReadsOnlyItsShards: a stage reading its own layers opens only
// the shards that hold them; a shard it does not need may be unreadable.
func TestReadHFReadsOnlyItsShards(t *testing.T) {
	m := hfModel(t, "llama", false)
	dir := writeHF(t, m, randomHFWeights(t, m), "F32", 200)
	var idx hfIndex
	b, _ := os.ReadFile(filepath.Join(dir, HFIndexName))
	if err := json.Unmarshal(b, &idx); err != nil {
		t.Fatal(err)
	}
	embed := idx.WeightMap["model.embed_tokens.weight"]
	head := idx.WeightMap["lm_head.weight"]
	if embed == head {
		t.Fatalf("embed and head both in %s; want them apart", embed)
	}
	if err := os.WriteFile(filepath.Join(dir, head), []byte("garbage"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ReadHF(m, dir, func(n string) bool { return n == "embed.tok" })
	if err != nil || len(got) != 1 {
		t.Fatalf("reading embed.tok with %s broken: %d tensors, %v", head, len(got), err)
	}
	if _, err := ReadHF(m, dir, nil); err == nil || !strings.Contains(err.Error(), head) {
		t.Fatalf("reading every parameter: %v, want an error naming %s", err, head)
	}
}

// TestHFRefusals: a missing shard, a tensor of another shape and one the
// model does not have are refused, naming the file and the tensor.
func TestHFRefusals(t *testing.T) {
	m := hfModel(t, "llama", false)
	w := randomHFWeights(t, m)

	dir := writeHF(t, m, w, "F32", 200)
	var idx hfIndex
	b, _ := os.ReadFile(filepath.Join(dir, HFIndexName))
	json.Unmarshal(b, &idx)
	shard := idx.WeightMap["model.norm.weight"]
	os.Remove(filepath.Join(dir, shard))
	err := CheckHF(m, dir)
	if err == nil || !strings.Contains(err.Error(), HFIndexName) || !strings.Contains(err.Error(), shard) || !strings.Contains(err.Error(), "is missing") {
		t.Errorf("missing shard: %v", err)
	}

	wide := hfModel(t, "llama", false)
	wide.Spec.Own["intermediate"] = 16
	wide, _ = models.Build(wide.Spec)
	dir = writeHF(t, wide, randomHFWeights(t, wide), "F32", 1<<30)
	err = CheckHF(m, dir)
	if err == nil || !strings.Contains(err.Error(), filepath.Join(dir, HFSingleName)) || !strings.Contains(err.Error(), "model.layers.0.mlp.gate_proj.weight has shape [16 8], the model needs [12 8]") {
		t.Errorf("wrong shape: %v", err)
	}

	tied := hfModel(t, "llama", true)
	dir = writeHF(t, m, w, "F32", 1<<30)
	if err := CheckHF(tied, dir); err == nil || !strings.Contains(err.Error(), "lm_head.weight is no parameter") {
		t.Errorf("extra tensor: %v", err)
	}
}

// TestReadHFMapsTheFile: reading one block of a 64 MiB checkpoint grows
// the Go heap by about that block, not the file: the file is mapped, and
// only the block's tensors are decoded.
func TestReadHFMapsTheFile(t *testing.T) {
	m, err := models.Build(models.Spec{Name: "llama", DType: "float32", Layers: 1, Width: 256, Heads: 2, Context: 4, Vocab: 65536,
		Own: map[string]any{"intermediate": 64}})
	if err != nil {
		t.Fatal(err)
	}
	ps, err := models.HFParams(m)
	if err != nil {
		t.Fatal(err)
	}
	var raw []RawTensor
	size := 0
	for _, p := range ps {
		n := 2
		for _, d := range p.HFShape {
			n *= d
		}
		raw = append(raw, RawTensor{Name: p.HF, DType: "BF16", Shape: p.HFShape, Data: make([]byte, n)})
		size += n
	}
	cfg, err := models.HFConfig(m, nil, "bfloat16")
	if err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "hf")
	if _, err := WriteHFDir(dir, cfg, raw, 1<<40); err != nil {
		t.Fatal(err)
	}
	raw = nil
	heap := func() uint64 {
		runtime.GC()
		var s runtime.MemStats
		runtime.ReadMemStats(&s)
		return s.HeapAlloc
	}
	before := heap()
	got, err := ReadHF(m, dir, func(n string) bool { return strings.HasPrefix(n, "block0.") })
	if err != nil {
		t.Fatal(err)
	}
	grown := int64(heap()) - int64(before)
	if len(got) != 9 || grown > 4<<20 {
		t.Errorf("reading block0 (%d tensors) of a %d MiB checkpoint grew the heap by %d KiB", len(got), size>>20, grown>>10)
	}
	t.Logf("block0 of a %d MiB checkpoint: heap grew %d KiB", size>>20, grown>>10)
	runtime.KeepAlive(got)
}

// TestHFReadsGPT2ModelNames: a GPT-2 saved from GPT2Model (no
// "transformer." prefix), with the causal-mask buffers older versions
// saved, loads as the GPT.
func TestHFReadsGPT2ModelNames(t *testing.T) {
	m := hfModel(t, "gpt", true)
	w := randomHFWeights(t, m)
	ps, _ := models.HFParams(m)
	raw, err := ToHF(ps, w, func(string) string { return "F32" })
	if err != nil {
		t.Fatal(err)
	}
	for i := range raw {
		raw[i].Name = strings.TrimPrefix(raw[i].Name, "transformer.")
	}
	raw = append(raw, RawTensor{Name: "h.0.attn.bias", DType: "F32", Shape: []int{1, 1, 4, 4}, Data: make([]byte, 64)})
	cfg, _ := models.HFConfig(m, nil, "float32")
	dir := filepath.Join(t.TempDir(), "hf")
	if _, err := WriteHFDir(dir, cfg, raw, 1<<30); err != nil {
		t.Fatal(err)
	}
	if err := CheckHF(m, dir); err != nil {
		t.Fatal(err)
	}
	got, err := ReadHF(m, dir, nil)
	if err != nil {
		t.Fatal(err)
	}
	for n, want := range w {
		if err := DiffTensor(got[n], want); err != nil {
			t.Errorf("%s: %v", n, err)
		}
	}
}
