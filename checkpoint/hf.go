package checkpoint

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/models"
)

// A Hugging Face checkpoint directory holds config.json and either
// model.safetensors or shards named by model.safetensors.index.json's
// weight_map, under the names of models.HFParams, in F32, F16 or BF16.
const (
	HFConfigName = "config.json"
	HFSingleName = "model.safetensors"
	HFIndexName  = "model.safetensors.index.json"
)

// IsHFDir reports whether path is a Hugging Face checkpoint directory: a
// folder with config.json and model.safetensors or its sharded index.
func IsHFDir(path string) bool {
	if !isDir(path) || !isFile(filepath.Join(path, HFConfigName)) {
		return false
	}
	return isFile(filepath.Join(path, HFSingleName)) || isFile(filepath.Join(path, HFIndexName))
}

func isFile(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.Mode().IsRegular()
}

// hfIndex is the part of model.safetensors.index.json read.
type hfIndex struct {
	Metadata  map[string]any    `json:"metadata"`
	WeightMap map[string]string `json:"weight_map"`
}

// hfFiles maps each tensor of the checkpoint in dir to its file: the one
// model.safetensors (from its header), or the index's weight_map, whose
// every shard must exist in dir.
func hfFiles(dir string) (map[string]string, error) {
	index := filepath.Join(dir, HFIndexName)
	b, err := os.ReadFile(index)
	if os.IsNotExist(err) {
		single := filepath.Join(dir, HFSingleName)
		m, err := OpenMapped(single)
		if err != nil {
			return nil, err
		}
		defer m.Close()
		out := map[string]string{}
		for _, n := range m.Names() {
			out[n] = single
		}
		return out, nil
	}
	if err != nil {
		return nil, err
	}
	var idx hfIndex
	if err := json.Unmarshal(b, &idx); err != nil {
		return nil, fmt.Errorf("%s: %v", index, err)
	}
	if len(idx.WeightMap) == 0 {
		return nil, fmt.Errorf("%s: weight_map is empty or missing", index)
	}
	out := map[string]string{}
	for _, name := range slices.Sorted(maps.Keys(idx.WeightMap)) {
		shard := idx.WeightMap[name]
		if shard != filepath.Base(shard) || !strings.HasSuffix(shard, ".safetensors") {
			return nil, fmt.Errorf("%s: weight_map[%q]: %q is not a .safetensors file of the directory", index, name, shard)
		}
		path := filepath.Join(dir, shard)
		if !isFile(path) {
			return nil, fmt.Errorf("%s: weight_map[%q]: shard %s is missing", index, name, path)
		}
		out[name] = path
	}
	return out, nil
}

// hfLocate finds the tensor named HF in the checkpoint, also under a
// GPT2Model's names (a checkpoint saved without the LM head's
// "transformer." prefix).
func hfLocate(files map[string]string, p models.HFParam) (string, bool) {
	if _, ok := files[p.HF]; ok {
		return p.HF, true
	}
	if bare, ok := strings.CutPrefix(p.HF, "transformer."); ok {
		if _, ok := files[bare]; ok {
			return bare, true
		}
	}
	return "", false
}

// hfBuffer reports tensors an older checkpoint saved that are no
// parameters: GPT-2's causal masks and Llama's rotary frequencies, which
// pipetrain computes.
func hfBuffer(name string) bool {
	return strings.HasSuffix(name, ".attn.bias") && !strings.Contains(name, "c_attn") ||
		strings.HasSuffix(name, ".attn.masked_bias") || strings.HasSuffix(name, ".rotary_emb.inv_freq")
}

// hfSource is where a parameter's tensor lies: its name and file.
type hfSource struct {
	models.HFParam
	tensor, file string
}

// planHF finds the tensor of every parameter of params that want accepts
// (all when nil) in the checkpoint in dir, with the shape it needs. With
// all, a tensor of the checkpoint that no parameter reads is refused.
func planHF(params []models.HFParam, dir string, want func(string) bool) ([]hfSource, error) {
	files, err := hfFiles(dir)
	if err != nil {
		return nil, err
	}
	headers := map[string]*Mapped{}
	defer func() {
		for _, m := range headers {
			m.Close()
		}
	}()
	used := map[string]bool{}
	var out []hfSource
	for _, p := range params {
		if want != nil && !want(p.Name) {
			continue
		}
		name, ok := hfLocate(files, p)
		if !ok {
			return nil, fmt.Errorf("%s: no tensor %s (shape %v, the model's %s)", dir, p.HF, p.HFShape, p.Name)
		}
		file := files[name]
		if headers[file] == nil {
			if headers[file], err = OpenMapped(file); err != nil {
				return nil, err
			}
		}
		_, shape, ok := headers[file].Info(name)
		if !ok {
			return nil, fmt.Errorf("%s: no tensor %s, which %s places in it", file, name, HFIndexName)
		}
		if !slices.Equal(shape, p.HFShape) {
			return nil, fmt.Errorf("%s: tensor %s has shape %v, the model needs %v (for %s)", file, name, shape, p.HFShape, p.Name)
		}
		used[name] = true
		out = append(out, hfSource{HFParam: p, tensor: name, file: file})
	}
	if want == nil {
		var extra []string
		for name, file := range files {
			if !used[name] && !hfBuffer(name) {
				extra = append(extra, file+": "+name)
			}
		}
		if len(extra) > 0 {
			slices.Sort(extra)
			return nil, fmt.Errorf("%s: tensor %s is no parameter of this model (a checkpoint of another model or size?)", dir, extra[0])
		}
	}
	return out, nil
}

// CheckHF checks that the Hugging Face checkpoint in dir holds every
// parameter of m with the shape it needs, and nothing else, reading only
// the files' headers.
func CheckHF(m *models.Model, dir string) error {
	params, err := models.HFParams(m)
	if err != nil {
		return err
	}
	_, err = planHF(params, dir, nil)
	return err
}

// ReadHF reads the parameters of m that want accepts (all when nil) from
// the Hugging Face checkpoint in dir, by pipetrain name in pipetrain's
// layouts and m's dtype. It maps only the files holding them and decodes
// only their tensors.
func ReadHF(m *models.Model, dir string, want func(string) bool) (map[string]Tensor, error) {
	params, err := models.HFParams(m)
	if err != nil {
		return nil, err
	}
	srcs, err := planHF(params, dir, want)
	if err != nil {
		return nil, err
	}
	f64 := m.DType == tensor.Float64
	open := map[string]*Mapped{}
	defer func() {
		for _, mf := range open {
			mf.Close()
		}
	}()
	decoded := map[string]Tensor{}
	out := map[string]Tensor{}
	for _, s := range srcs {
		t, ok := decoded[s.tensor]
		if !ok {
			if open[s.file] == nil {
				if open[s.file], err = OpenMapped(s.file); err != nil {
					return nil, err
				}
			}
			if t, err = open[s.file].Tensor(s.tensor, f64); err != nil {
				return nil, err
			}
			decoded[s.tensor] = t
		}
		out[s.Name] = fromHF(t, s.HFParam)
	}
	return out, nil
}

// fromHF cuts parameter p out of its checkpoint tensor t.
func fromHF(t Tensor, p models.HFParam) Tensor {
	out := Tensor{Name: p.Name, Shape: slices.Clone(p.Shape), F32: t.F32, F64: t.F64}
	if p.Cols[1] > 0 {
		out.F32, out.F64 = columns(t.F32, p.HFShape, p.Cols), columns(t.F64, p.HFShape, p.Cols)
	}
	if p.Transpose {
		rows, cols := p.HFShape[0], p.HFShape[1]
		if out.F64 != nil {
			out.F64 = transposed(out.F64, rows, cols)
		} else {
			out.F32 = transposed(out.F32, rows, cols)
		}
	}
	return out
}

// columns is the range cols of the last dimension of a, of shape.
func columns[T float32 | float64](a []T, shape []int, cols [2]int) []T {
	if a == nil {
		return nil
	}
	last := shape[len(shape)-1]
	rows := len(a) / last
	w := cols[1] - cols[0]
	out := make([]T, 0, rows*w)
	for r := range rows {
		out = append(out, a[r*last+cols[0]:r*last+cols[1]]...)
	}
	return out
}

// HFDTypes are the dtypes of the checkpoint's tensors in dir, by name, read
// from the headers: an export writes each tensor back in its dtype.
func HFDTypes(dir string) (map[string]string, error) {
	files, err := hfFiles(dir)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	open := map[string]*Mapped{}
	defer func() {
		for _, m := range open {
			m.Close()
		}
	}()
	for name, file := range files {
		if open[file] == nil {
			if open[file], err = OpenMapped(file); err != nil {
				return nil, err
			}
		}
		if dt, _, ok := open[file].Info(name); ok {
			out[name] = dt
		}
	}
	return out, nil
}
