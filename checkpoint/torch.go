package checkpoint

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
)

// Weights cross to and from PyTorch by the map of models.TorchParams: export
// renames and transposes a run's weights into PyTorch's names and layouts;
// train.init_from reads them back (see docs/weights.md).

// ToTorch turns weights held by pipetrain name (a run's stage files merged)
// into params' PyTorch names and layouts, in params' order, keeping their
// dtype. A tied weight is written once; its copies must be equal bit for bit,
// or the run that wrote them was broken. from names, when it has it, the file
// a tensor came from, for errors.
func ToTorch(params []models.TorchParam, byName map[string]Tensor, from map[string]string) ([]Tensor, error) {
	where := func(name string) string {
		if f := from[name]; f != "" {
			return f + ": "
		}
		return ""
	}
	first := map[string]string{} // PyTorch name -> the pipetrain parameter exported under it
	var out []Tensor
	for _, p := range params {
		t, ok := byName[p.Name]
		if !ok {
			return nil, fmt.Errorf("no tensor %s", p.Name)
		}
		if !slices.Equal(t.Shape, p.Shape) {
			return nil, fmt.Errorf("%stensor %s has shape %v, the model needs %v", where(p.Name), p.Name, t.Shape, p.Shape)
		}
		if p.Copy {
			if orig, ok := first[p.Torch]; ok {
				if err := DiffTensor(byName[orig], t); err != nil {
					return nil, fmt.Errorf("%stied weights %s and %s differ (%s%v)", where(p.Name), orig, p.Name, orig, err)
				}
			}
			continue
		}
		first[p.Torch] = p.Name
		out = append(out, relayout(t, p.Torch, p.Shape, p.Transpose))
	}
	return out, nil
}

// relayout is t named name, transposed from shape (2-D) when asked.
func relayout(t Tensor, name string, shape []int, transpose bool) Tensor {
	out := Tensor{Name: name, Shape: slices.Clone(t.Shape), F32: t.F32, F64: t.F64}
	if !transpose {
		return out
	}
	rows, cols := shape[0], shape[1]
	out.Shape = []int{cols, rows}
	if t.F64 != nil {
		out.F64 = transposed(t.F64, rows, cols)
	} else {
		out.F32 = transposed(t.F32, rows, cols)
	}
	return out
}

// transposed is the [cols, rows] transpose of the row-major [rows, cols] a.
func transposed[T float32 | float64](a []T, rows, cols int) []T {
	out := make([]T, len(a))
	for r := range rows {
		for c := range cols {
			out[c*rows+r] = a[r*cols+c]
		}
	}
	return out
}

// An init file is read in one of two layouts. A file a pipetrain run wrote
// (final weights or a checkpoint part: its metadata names its "stage") holds
// pipetrain's names and layouts; any other (pipetrain export, PyTorch) holds
// PyTorch's. A folder stands for its *.safetensors files merged, and a run
// directory for its weights/ folder, so a run's own stage files can start
// another run.

// initSource is one file of an init path, its header read.
type initSource struct {
	path    string
	native  bool // pipetrain's names and layouts
	entries map[string]entry
}

// initFiles lists the safetensors files path stands for.
func initFiles(path string) ([]string, error) {
	st, err := os.Stat(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return nil, fmt.Errorf("%s: %w", path, pathErr.Err)
		}
		return nil, err
	}
	if !st.IsDir() {
		if !st.Mode().IsRegular() {
			// A device or a pipe could block or never end.
			return nil, fmt.Errorf("%s: not a regular file", path)
		}
		return []string{path}, nil
	}
	dir := path
	if w := filepath.Join(path, "weights"); isDir(w) {
		dir = w
	}
	files, err := filepath.Glob(filepath.Join(dir, "*.safetensors"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("%s: no .safetensors files", dir)
	}
	return files, nil
}

func isDir(path string) bool {
	st, err := os.Stat(path)
	return err == nil && st.IsDir()
}

// readHeader reads a safetensors file's tensor entries and metadata, checking
// that every tensor is F32 or F64 and lies within the file.
func readHeader(path string) (map[string]entry, map[string]string, error) {
	f, err := os.Open(path)
	if err != nil {
		var pathErr *os.PathError
		if errors.As(err, &pathErr) {
			return nil, nil, fmt.Errorf("%s: %w", path, pathErr.Err)
		}
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	bad := func(format string, args ...any) error {
		return fmt.Errorf("%s: "+format, append([]any{path}, args...)...)
	}
	var n uint64
	if err := binary.Read(f, binary.LittleEndian, &n); err != nil || st.Size() < 8 {
		return nil, nil, bad("not a safetensors file (%d bytes, too short for a header)", st.Size())
	}
	if n > maxHeader || n > uint64(st.Size()-8) {
		return nil, nil, bad("not a safetensors file (header length %d in a %d-byte file)", n, st.Size())
	}
	hdr := make([]byte, n)
	if _, err := io.ReadFull(f, hdr); err != nil {
		return nil, nil, bad("header: %v", err)
	}
	entries, meta, err := parseHeader(hdr, bad)
	if err != nil {
		return nil, nil, err
	}
	data := st.Size() - 8 - int64(n)
	for name, e := range entries {
		size := map[string]int64{"F32": 4, "F64": 8}[e.DType]
		if size == 0 {
			return nil, nil, bad("tensor %s is %s; only F32 and F64 are read (in PyTorch, .float() before saving)", name, e.DType)
		}
		count := int64(1)
		for _, d := range e.Shape {
			if d < 0 || (d > 0 && count > math.MaxInt32/int64(d)) {
				return nil, nil, bad("tensor %s: bad shape %v", name, e.Shape)
			}
			count *= int64(d)
		}
		if lo, hi := int64(e.Offsets[0]), int64(e.Offsets[1]); lo < 0 || hi-lo != count*size || hi > data {
			return nil, nil, bad("tensor %s: bytes [%d, %d) do not hold %s %v within the file's %d data bytes (truncated?)", name, lo, hi, e.DType, e.Shape, data)
		}
	}
	return entries, meta, nil
}

// initPlan says where each parameter of a model comes from in an init path.
type initPlan struct {
	sources []initSource
	from    map[string]initFrom // by pipetrain name
}

type initFrom struct {
	src       *initSource
	name      string // the tensor's name in src
	transpose bool
}

// planInit reads the headers of path's files and finds every parameter of
// params in them with the shape it needs. A missing or mis-shaped tensor,
// one held twice, or a tensor that is no parameter of the model (another
// model's file) is an error naming it.
func planInit(params []models.TorchParam, path string) (*initPlan, error) {
	files, err := initFiles(path)
	if err != nil {
		return nil, err
	}
	plan := &initPlan{from: map[string]initFrom{}}
	for _, f := range files {
		entries, meta, err := readHeader(f)
		if err != nil {
			return nil, err
		}
		_, native := meta["stage"]
		plan.sources = append(plan.sources, initSource{path: f, native: native, entries: entries})
	}
	// find returns the one source holding name in the given layout.
	find := func(name string, native bool) (*initSource, error) {
		var found *initSource
		for i := range plan.sources {
			s := &plan.sources[i]
			if _, ok := s.entries[name]; ok && s.native == native {
				if found != nil {
					return nil, fmt.Errorf("tensor %s is in both %s and %s", name, found.path, s.path)
				}
				found = s
			}
		}
		return found, nil
	}
	anyNative, anyTorch := false, false
	for _, s := range plan.sources {
		anyNative, anyTorch = anyNative || s.native, anyTorch || !s.native
	}
	used := map[*initSource]map[string]bool{}
	for _, p := range params {
		torch, err := find(p.Torch, false)
		if err != nil {
			return nil, err
		}
		own, err := find(p.Name, true)
		if err != nil {
			return nil, err
		}
		var src *initSource
		var name string
		var want []int
		switch {
		case torch != nil && own != nil:
			return nil, fmt.Errorf("parameter %s is in %s (as %s) and in %s (pipetrain's own file)", p.Name, torch.path, p.Torch, own.path)
		case torch != nil:
			src, name, want = torch, p.Torch, p.TorchShape
		case own != nil:
			src, name, want = own, p.Name, p.Shape
		default:
			return nil, fmt.Errorf("%w; %s", missingTensor(p, path, anyNative, anyTorch), holdings(plan.sources))
		}
		if got := src.entries[name].Shape; !slices.Equal(got, want) {
			return nil, misshapen(p, src, name, got, want)
		}
		if used[src] == nil {
			used[src] = map[string]bool{}
		}
		used[src][name] = true
		plan.from[p.Name] = initFrom{src: src, name: name, transpose: src == torch && p.Transpose}
	}
	for i := range plan.sources {
		s := &plan.sources[i]
		var extra []string
		for name := range s.entries {
			// A checkpoint part also holds the optimizer's state.
			if !used[s][name] && !(s.native && strings.HasPrefix(name, "optim.")) {
				extra = append(extra, name)
			}
		}
		if len(extra) > 0 {
			slices.Sort(extra)
			more := ""
			if len(extra) > 5 {
				more = fmt.Sprintf(" and %d more", len(extra)-5)
				extra = extra[:5]
			}
			what := "tensor %s%s is no parameter"
			if len(extra) > 1 {
				what = "tensors %s%s are no parameters"
			}
			return nil, fmt.Errorf("%s: "+what+" of this model (a file of another model or size?)", s.path, strings.Join(extra, ", "), more)
		}
	}
	return plan, nil
}

// missingTensor names p as the files of path would hold it.
func missingTensor(p models.TorchParam, in string, anyNative, anyTorch bool) error {
	switch {
	case anyNative && !anyTorch:
		return fmt.Errorf("%s: no tensor %s (shape %v)", in, p.Name, p.Shape)
	case anyTorch && !anyNative:
		return fmt.Errorf("%s: no tensor %s (shape %v, the model's %s)", in, p.Torch, p.TorchShape, p.Name)
	}
	return fmt.Errorf("%s: no tensor %s (PyTorch's name, shape %v) or %s (pipetrain's, shape %v)", in, p.Torch, p.TorchShape, p.Name, p.Shape)
}

// holdings says which tensors the init files hold, the first few by name:
// a file of other names (an nn.Sequential's "0.weight") is then plain.
func holdings(sources []initSource) string {
	var names []string
	for _, s := range sources {
		for name := range s.entries {
			names = append(names, name)
		}
	}
	slices.Sort(names)
	const shown = 5
	list := strings.Join(names[:min(shown, len(names))], ", ")
	if len(names) > shown {
		list += fmt.Sprintf(", ... (%d more)", len(names)-shown)
	}
	what := "file holds"
	if len(sources) > 1 {
		what = "files hold"
	}
	if len(names) == 0 {
		return "the " + what + " no tensors"
	}
	return fmt.Sprintf("the %s %s: %s", what, words.Count(len(names), "tensor"), list)
}

func misshapen(p models.TorchParam, src *initSource, name string, got, want []int) error {
	layout := "pipetrain's layout"
	if !src.native {
		layout = "PyTorch's layout"
		if p.Transpose {
			layout = "PyTorch's layout, [out, in]"
		}
	}
	msg := fmt.Sprintf("%s: tensor %s has shape %v, the model needs %v (%s)", src.path, name, got, want, layout)
	if p.Transpose && slices.Equal(got, []int{want[1], want[0]}) {
		if src.native {
			msg += "; it looks transposed: a file without pipetrain's \"stage\" metadata is read in PyTorch's layout"
		} else {
			msg += "; it looks transposed: was it written in pipetrain's layout [in, out]?"
		}
	}
	return errors.New(msg)
}

// CheckInit checks that path (a safetensors file, a folder of them, a run
// directory, or a Hugging Face checkpoint directory, see CheckHF) holds
// every parameter of m, in PyTorch's names and layouts or pipetrain's, with
// the shapes m needs and nothing else, reading only the files' headers.
func CheckInit(m *models.Model, path string) error {
	if IsHFDir(path) {
		return CheckHF(m, path)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		return err
	}
	_, err = planInit(params, path)
	return err
}

// ReadInit reads the parameters of m that want accepts (all when want is
// nil) from path, checked as CheckInit checks it, and returns them by
// pipetrain name in pipetrain's layouts, converted to m's dtype.
func ReadInit(m *models.Model, path string, want func(name string) bool) (map[string]Tensor, error) {
	if IsHFDir(path) {
		return ReadHF(m, path, want)
	}
	params, err := models.TorchParams(m)
	if err != nil {
		return nil, err
	}
	plan, err := planInit(params, path)
	if err != nil {
		return nil, err
	}
	for _, s := range plan.sources {
		// A file with a checksum file (an export, a run's weights) must
		// match it; one without (PyTorch's) is taken as it is.
		if err := VerifyFile(s.path); err != nil && !errors.Is(err, ErrNoChecksum) {
			return nil, err
		}
	}
	read := map[*initSource]map[string]Tensor{}
	out := map[string]Tensor{}
	for _, p := range params {
		if want != nil && !want(p.Name) {
			continue
		}
		f := plan.from[p.Name]
		if read[f.src] == nil {
			ts, _, err := Read(f.src.path)
			if err != nil {
				return nil, err
			}
			read[f.src] = map[string]Tensor{}
			for _, t := range ts {
				read[f.src][t.Name] = t
			}
		}
		t := read[f.src][f.name]
		if f.transpose {
			t = relayout(t, p.Name, p.TorchShape, true)
		}
		t.Name = p.Name
		out[p.Name] = convert(t, m.DType == tensor.Float64)
	}
	return out, nil
}

// convert gives t the model's dtype: float32 widens exactly; float64 rounds.
func convert(t Tensor, f64 bool) Tensor {
	switch {
	case f64 && t.F64 == nil:
		t.F64 = make([]float64, len(t.F32))
		for i, v := range t.F32 {
			t.F64[i] = float64(v)
		}
		t.F32 = nil
	case !f64 && t.F64 != nil:
		t.F32 = make([]float32, len(t.F64))
		for i, v := range t.F64 {
			t.F32[i] = float32(v)
		}
		t.F64 = nil
	}
	return t
}
