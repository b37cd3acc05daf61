// Package checkpoint stores model weights in the safetensors format (an 8-byte
// little-endian header length, a JSON header naming each tensor's dtype, shape and
// byte range, then the raw little-endian data), so other tools can read pipetrain's
// weights. Files are written atomically: a reader sees the old file or the new one,
// never half of one.
package checkpoint

import (
	"bufio"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"sort"

	"github.com/pipetrain/pipetrain/runlog"
)

// Tensor is one named array. Exactly one of F32 and F64 is set.
type Tensor struct {
	Name  string
	Shape []int
	F32   []float32
	F64   []float64
}

func (t Tensor) dtype() string {
	if t.F64 != nil {
		return "F64"
	}
	return "F32"
}

func (t Tensor) byteLen() int {
	if t.F64 != nil {
		return 8 * len(t.F64)
	}
	return 4 * len(t.F32)
}

type entry struct {
	DType   string `json:"dtype"`
	Shape   []int  `json:"shape"`
	Offsets [2]int `json:"data_offsets"`
}

// maxHeader bounds the JSON header a reader accepts, so a corrupt length cannot
// make it allocate gigabytes.
const maxHeader = 100 << 20

// Write stores tensors (sorted by name) and string metadata at path atomically:
// temporary file in the same directory, fsync, rename, fsync of the directory.
func Write(path string, tensors []Tensor, meta map[string]string) error {
	_, err := WriteSum(path, tensors, meta)
	return err
}

// WriteSum is Write that also returns the file's SHA-256 (hex), computed as it is
// written.
func WriteSum(path string, tensors []Tensor, meta map[string]string) (string, error) {
	sorted := append([]Tensor(nil), tensors...)
	sort.Slice(sorted, func(i, j int) bool { return sorted[i].Name < sorted[j].Name })
	header := map[string]any{}
	if len(meta) > 0 {
		header["__metadata__"] = meta
	}
	off := 0
	for _, t := range sorted {
		n := 1
		for _, d := range t.Shape {
			n *= d
		}
		if size := t.byteLen() / map[string]int{"F32": 4, "F64": 8}[t.dtype()]; size != n {
			return "", fmt.Errorf("checkpoint: tensor %s has %d values, shape %v needs %d", t.Name, size, t.Shape, n)
		}
		if _, dup := header[t.Name]; dup {
			return "", fmt.Errorf("checkpoint: tensor name %s used twice", t.Name)
		}
		header[t.Name] = entry{DType: t.dtype(), Shape: append([]int{}, t.Shape...), Offsets: [2]int{off, off + t.byteLen()}}
		off += t.byteLen()
	}
	hdr, err := json.Marshal(header)
	if err != nil {
		return "", err
	}
	// Pad the header with spaces to 8 bytes so the data that follows stays aligned.
	for len(hdr)%8 != 0 {
		hdr = append(hdr, ' ')
	}
	sum := sha256.New()
	err = WriteAtomic(path, func(out io.Writer) error {
		w := io.MultiWriter(out, sum)
		if err := binary.Write(w, binary.LittleEndian, uint64(len(hdr))); err != nil {
			return err
		}
		if _, err := w.Write(hdr); err != nil {
			return err
		}
		for _, t := range sorted {
			var buf []byte
			if t.F64 != nil {
				buf = make([]byte, 0, 8*len(t.F64))
				for _, v := range t.F64 {
					buf = binary.LittleEndian.AppendUint64(buf, math.Float64bits(v))
				}
			} else {
				buf = make([]byte, 0, 4*len(t.F32))
				for _, v := range t.F32 {
					buf = binary.LittleEndian.AppendUint32(buf, math.Float32bits(v))
				}
			}
			if _, err := w.Write(buf); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return "", err
	}
	return hex.EncodeToString(sum.Sum(nil)), nil
}

// WriteAtomic writes a file through fill so that path never holds a partial
// file; the file ends with runlog.FileMode (0600, or 0644 in a shared run
// directory).
func WriteAtomic(path string, fill func(io.Writer) error) (err error) {
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			f.Close()
			os.Remove(f.Name())
		}
	}()
	// CreateTemp makes the file 0600; the finished file has the mode of
	// every other the run writes.
	if err = f.Chmod(runlog.FileMode()); err != nil {
		return err
	}
	bw := bufio.NewWriterSize(f, 1<<20)
	if err = fill(bw); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = bw.Flush(); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	if err = f.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", path, err)
	}
	if err = f.Close(); err != nil {
		return err
	}
	if err = os.Rename(f.Name(), path); err != nil {
		return err
	}
	if d, derr := os.Open(dir); derr == nil {
		d.Sync()
		d.Close()
	}
	return nil
}

// ReadMeta reads only the metadata of a safetensors file: its header, not
// its tensors.
func ReadMeta(path string) (map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil {
		return nil, fmt.Errorf("checkpoint %s: header length: %w", path, err)
	}
	if n > maxHeader {
		return nil, fmt.Errorf("checkpoint %s: header length %d is beyond %d bytes", path, n, maxHeader)
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, fmt.Errorf("checkpoint %s: header: %w", path, err)
	}
	var h struct {
		Meta map[string]string `json:"__metadata__"`
	}
	if err := json.Unmarshal(hdr, &h); err != nil {
		return nil, fmt.Errorf("checkpoint %s: header: %w", path, err)
	}
	return h.Meta, nil
}

// Read loads every tensor and the metadata from a safetensors file written by
// Write (F32 and F64 tensors).
func Read(path string) ([]Tensor, map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("checkpoint %s: "+format, append([]any{path}, args...)...)
	}
	if len(b) < 8 {
		return nil, nil, bad("file is %d bytes, too short for a header", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > maxHeader || n > uint64(len(b)-8) {
		return nil, nil, bad("header length %d does not fit the %d-byte file", n, len(b))
	}
	entries, meta, err := parseHeader(b[8:8+n], bad)
	if err != nil {
		return nil, nil, err
	}
	data := b[8+n:]
	var out []Tensor
	for name, e := range entries {
		t, err := decode(name, e, data)
		if err != nil {
			return nil, nil, bad("%v", err)
		}
		out = append(out, t)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Name < out[j].Name })
	return out, meta, nil
}

// parseHeader splits a safetensors header into its tensors' entries and its
// metadata; bad makes an error that names the file.
func parseHeader(hdr []byte, bad func(format string, args ...any) error) (map[string]entry, map[string]string, error) {
	var raw map[string]json.RawMessage
	if err := json.Unmarshal(hdr, &raw); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	entries := map[string]entry{}
	var meta map[string]string
	for name, msg := range raw {
		if name == "__metadata__" {
			if err := json.Unmarshal(msg, &meta); err != nil {
				return nil, nil, bad("metadata: %v", err)
			}
			continue
		}
		var e entry
		if err := json.Unmarshal(msg, &e); err != nil {
			return nil, nil, bad("tensor %s: %v", name, err)
		}
		entries[name] = e
	}
	return entries, meta, nil
}

func decode(name string, e entry, data []byte) (Tensor, error) {
	size := map[string]int{"F32": 4, "F64": 8}[e.DType]
	if size == 0 {
		return Tensor{}, fmt.Errorf("tensor %s: dtype %q not supported (F32, F64)", name, e.DType)
	}
	n := 1
	for _, d := range e.Shape {
		if d < 0 || (d > 0 && n > math.MaxInt32/d) {
			return Tensor{}, fmt.Errorf("tensor %s: bad shape %v", name, e.Shape)
		}
		n *= d
	}
	lo, hi := e.Offsets[0], e.Offsets[1]
	if lo < 0 || hi < lo || hi > len(data) || hi-lo != n*size {
		return Tensor{}, fmt.Errorf("tensor %s: byte range [%d, %d) does not hold shape %v %s in %d data bytes", name, lo, hi, e.Shape, e.DType, len(data))
	}
	t := Tensor{Name: name, Shape: e.Shape}
	raw := data[lo:hi]
	if size == 8 {
		t.F64 = make([]float64, n)
		for i := range t.F64 {
			t.F64[i] = math.Float64frombits(binary.LittleEndian.Uint64(raw[8*i:]))
		}
	} else {
		t.F32 = make([]float32, n)
		for i := range t.F32 {
			t.F32[i] = math.Float32frombits(binary.LittleEndian.Uint32(raw[4*i:]))
		}
	}
	return t, nil
}

// ReadAll merges the tensors of every *.safetensors file in dir (one per stage of a
// run) by name; a name in two files is an error.
func ReadAll(dir string) (map[string]Tensor, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("checkpoint: no .safetensors files in %s", dir)
	}
	// Files without a checksum file (older runs') are read unchecked;
	// MissingSums names them for the caller to say so.
	if _, err := VerifyFiles(files); err != nil {
		return nil, err
	}
	out := map[string]Tensor{}
	from := map[string]string{}
	for _, f := range files {
		ts, _, err := Read(f)
		if err != nil {
			return nil, err
		}
		for _, t := range ts {
			if prev, dup := from[t.Name]; dup {
				return nil, fmt.Errorf("checkpoint: tensor %s is in both %s and %s", t.Name, prev, f)
			}
			out[t.Name], from[t.Name] = t, f
		}
	}
	return out, nil
}

// CopyInto copies tensor name of byName into data ([]float32 or []float64)
// of the given shape, refusing a missing tensor, another shape or another
// dtype with an error naming it.
func CopyInto(byName map[string]Tensor, name string, shape []int, data any) error {
	t, ok := byName[name]
	if !ok {
		return fmt.Errorf("no tensor %s", name)
	}
	if !slices.Equal(t.Shape, shape) {
		return fmt.Errorf("tensor %s has shape %v, the model %v", name, t.Shape, shape)
	}
	switch d := data.(type) {
	case []float32:
		if t.F32 == nil {
			return fmt.Errorf("tensor %s is not float32", name)
		}
		copy(d, t.F32)
	case []float64:
		if t.F64 == nil {
			return fmt.Errorf("tensor %s is not float64", name)
		}
		copy(d, t.F64)
	default:
		return fmt.Errorf("tensor %s: cannot copy into %T", name, data)
	}
	return nil
}
