package checkpoint

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"

	"github.com/pipetrain/pipetrain/models"
)

// RawTensor is a tensor as it is written: its values already encoded in
// DType, little-endian.
type RawTensor struct {
	Name  string
	DType string
	Shape []int
	Data  []byte
}

// ToHF assembles the Hugging Face tensors of params from a run's weights
// held by pipetrain name, in the order params first name them, each
// encoded in dtype(name) (F32, F16 or BF16; F64 weights narrow). Tied
// copies must be equal bit for bit and are written once.
func ToHF(params []models.HFParam, byName map[string]Tensor, dtype func(hf string) string) ([]RawTensor, error) {
	type building struct {
		shape  []int
		values []float64
	}
	var order []string
	built := map[string]*building{}
	first := map[string]string{}
	for _, p := range params {
		t, ok := byName[p.Name]
		if !ok {
			return nil, fmt.Errorf("no tensor %s", p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return nil, fmt.Errorf("tensor %s has shape %v, the model needs %v", p.Name, t.Shape, p.Shape)
		}
		if p.Copy {
			if orig, ok := first[p.HF]; ok {
				if err := DiffTensor(byName[orig], t); err != nil {
					return nil, fmt.Errorf("tied weights %s and %s differ (%s%v)", orig, p.Name, orig, err)
				}
			}
			continue
		}
		if _, ok := first[p.HF]; !ok {
			first[p.HF] = p.Name
		}
		b := built[p.HF]
		if b == nil {
			n := 1
			for _, d := range p.HFShape {
				n *= d
			}
			b = &building{shape: p.HFShape, values: make([]float64, n)}
			built[p.HF] = b
			order = append(order, p.HF)
		}
		placeHF(b.values, p, float64s(t))
	}
	out := make([]RawTensor, 0, len(order))
	for _, name := range order {
		dt := dtype(name)
		data, err := encode(built[name].values, dt)
		if err != nil {
			return nil, fmt.Errorf("tensor %s: %w", name, err)
		}
		out = append(out, RawTensor{Name: name, DType: dt, Shape: built[name].shape, Data: data})
	}
	return out, nil
}

func float64s(t Tensor) []float64 {
	if t.F64 != nil {
		return t.F64
	}
	out := make([]float64, len(t.F32))
	for i, v := range t.F32 {
		out[i] = float64(v)
	}
	return out
}

// placeHF writes parameter p's values v (pipetrain's layout) into its
// place in the Hugging Face tensor dst, the inverse of fromHF.
func placeHF(dst []float64, p models.HFParam, v []float64) {
	if p.Transpose {
		v = transposed(v, p.Shape[0], p.Shape[1])
	}
	if p.Cols[1] == 0 {
		copy(dst, v)
		return
	}
	last := p.HFShape[len(p.HFShape)-1]
	w := p.Cols[1] - p.Cols[0]
	for r := range len(v) / w {
		copy(dst[r*last+p.Cols[0]:r*last+p.Cols[1]], v[r*w:(r+1)*w])
	}
}

// encode writes values in dtype, rounding to nearest even.
func encode(values []float64, dtype string) ([]byte, error) {
	size := dtypeSize[dtype]
	if size == 0 || dtype == "F64" {
		return nil, fmt.Errorf("dtype %s is not written (F32, F16, BF16)", dtype)
	}
	out := make([]byte, 0, int(size)*len(values))
	for _, v := range values {
		f := float32(v)
		switch dtype {
		case "F32":
			out = binary.LittleEndian.AppendUint32(out, math.Float32bits(f))
		case "BF16":
			out = binary.LittleEndian.AppendUint16(out, F32ToBF16(f))
		case "F16":
			out = binary.LittleEndian.AppendUint16(out, F32ToF16(f))
		}
	}
	return out, nil
}

// writeRaw stores tensors, in their order, as one safetensors file at path.
func writeRaw(path string, tensors []RawTensor, meta map[string]string) error {
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	off := 0
	for _, t := range tensors {
		header[t.Name] = entry{DType: t.DType, Shape: slices.Clone(t.Shape), Offsets: [2]int{off, off + len(t.Data)}}
		off += len(t.Data)
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return err
	}
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	return WriteAtomic(path, func(w io.Writer) error {
		if err := binary.Write(w, binary.LittleEndian, uint64(len(hdr))); err != nil {
			return err
		}
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		for _, t := range tensors {
			if _, err := w.Write(t.Data); err != nil {
				return err
			}
		}
		return nil
	})
}

// shards splits tensors, in order, into files of at most limit bytes of
// data each (a tensor larger than limit alone in its file).
func shards(tensors []RawTensor, limit int64) [][]RawTensor {
	var out [][]RawTensor
	var cur []RawTensor
	var size int64
	for _, t := range tensors {
		if len(cur) > 0 && size+int64(len(t.Data)) > limit {
			out = append(out, cur)
			cur, size = nil, 0
		}
		cur = append(cur, t)
		size += int64(len(t.Data))
	}
	if len(cur) > 0 || len(out) == 0 {
		out = append(out, cur)
	}
	return out
}

// WriteHFDir writes a Hugging Face checkpoint directory at dir: config.json
// and model.safetensors, or, when the tensors' data is over shardSize
// bytes, model-0000k-of-0000N.safetensors and model.safetensors.index.json.
// It is written in a temporary folder beside dir and renamed into place, so
// dir never holds part of a checkpoint; an existing dir is replaced. It
// returns the files written, relative to dir.
func WriteHFDir(dir string, config map[string]any, tensors []RawTensor, shardSize int64) ([]string, error) {
	if shardSize < 1 {
		return nil, fmt.Errorf("shard size %d: must be positive", shardSize)
	}
	parent, base := filepath.Dir(dir), filepath.Base(dir)
	tmp, err := os.MkdirTemp(parent, "."+base+".tmp-*")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(tmp)
	if err := os.Chmod(tmp, 0o755); err != nil {
		return nil, err
	}
	cfg, err := json.MarshalIndent(config, "", "  ")
	if err != nil {
		return nil, err
	}
	err = WriteAtomic(filepath.Join(tmp, HFConfigName), func(w io.Writer) error {
		_, err := w.Write(append(cfg, '\n'))
		return err
	})
	if err != nil {
		return nil, err
	}
	files := []string{HFConfigName}
	meta := map[string]string{"format": "pt"}
	parts := shards(tensors, shardSize)
	if len(parts) == 1 {
		if err := writeRaw(filepath.Join(tmp, HFSingleName), parts[0], meta); err != nil {
			return nil, err
		}
		files = append(files, HFSingleName)
	} else {
		index := hfIndex{Metadata: map[string]any{}, WeightMap: map[string]string{}}
		total := 0
		for i, part := range parts {
			name := fmt.Sprintf("model-%05d-of-%05d.safetensors", i+1, len(parts))
			if err := writeRaw(filepath.Join(tmp, name), part, meta); err != nil {
				return nil, err
			}
			for _, t := range part {
				index.WeightMap[t.Name] = name
				total += len(t.Data)
			}
			files = append(files, name)
		}
		index.Metadata["total_size"] = total
		b, err := json.MarshalIndent(index, "", "  ")
		if err != nil {
			return nil, err
		}
		err = WriteAtomic(filepath.Join(tmp, HFIndexName), func(w io.Writer) error {
			_, err := w.Write(append(b, '\n'))
			return err
		})
		if err != nil {
			return nil, err
		}
		files = append(files, HFIndexName)
	}
	if err := replaceDir(tmp, dir); err != nil {
		return nil, err
	}
	return files, nil
}

// replaceDir renames the finished folder tmp to dir; an existing dir is
// first moved aside, and removed once tmp is in its place.
func replaceDir(tmp, dir string) error {
	var old string
	if _, err := os.Lstat(dir); err == nil {
		old = tmp + ".old"
		if err := os.Rename(dir, old); err != nil {
			return err
		}
	}
	if err := os.Rename(tmp, dir); err != nil {
		if old != "" {
			os.Rename(old, dir)
		}
		return err
	}
	if old != "" {
		os.RemoveAll(old)
	}
	if d, err := os.Open(filepath.Dir(dir)); err == nil {
		d.Sync()
		d.Close()
	}
	return nil
}
