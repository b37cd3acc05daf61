package data

import (
	"bufio"
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
)

// Array is an array of examples read in place: a NumPy file's, a safetensors
// tensor's or an IDX file's data, its first dimension the examples. Opening
// one reads its header; its elements are read as batches need them, from a
// memory mapping of the file (or, for a gzipped IDX file, from its
// decompressed bytes).
type Array struct {
	// Name says where the array is, for errors: the file, and for a
	// safetensors tensor "file:tensor".
	Name string
	// DType is the elements' type: uint8, float16, float32, int32 or int64.
	DType string
	// Shape is the array's shape, examples first.
	Shape []int64

	data   []byte // the elements, row-major, little-endian
	mapped []byte // the mapping to release, nil when data is on the heap
}

// arrayWidths are the byte widths of the dtypes an Array holds.
var arrayWidths = map[string]int{"uint8": 1, "float16": 2, "float32": 4, "int32": 4, "int64": 8}

// npyArrayTypes and safetensorsTypes map the files' dtype names to an Array's.
var (
	npyArrayTypes    = map[string]string{"|u1": "uint8", "<f2": "float16", "<f4": "float32", "<i4": "int32", "<i8": "int64"}
	safetensorsTypes = map[string]string{"U8": "uint8", "F16": "float16", "F32": "float32", "I32": "int32", "I64": "int64"}
)

// Rows is the number of examples, the first dimension.
func (a *Array) Rows() int {
	if len(a.Shape) == 0 {
		return 1
	}
	return int(a.Shape[0])
}

// RowLen is the number of elements of one example: the product of the
// dimensions after the first.
func (a *Array) RowLen() int {
	n := 1
	for _, d := range a.Shape[min(1, len(a.Shape)):] {
		n *= int(d)
	}
	return n
}

// Close releases the array's mapping.
func (a *Array) Close() error {
	b := a.mapped
	a.mapped, a.data = nil, nil
	return unmap(b)
}

// OpenArray opens the array spec names: "file.npy", "file.safetensors:tensor",
// or an IDX file (Fashion-MNIST's, uncompressed or gzipped). The header is
// checked against the file's length; a wrong header is an error wrapping
// ErrBadData, a missing file one wrapping fs.ErrNotExist, both naming the
// file.
func OpenArray(spec string) (*Array, error) {
	path, tensor := splitArraySpec(spec)
	switch {
	case tensor != "":
		return openSafetensorsArray(path, tensor)
	case strings.HasSuffix(path, ".safetensors"):
		return nil, BadData(fmt.Errorf("data: %s: name the tensor of a safetensors file as %s:NAME", path, path))
	case strings.HasSuffix(path, ".npy"):
		return openNPYArray(path)
	}
	return openIDXArray(path, true)
}

// splitArraySpec splits "file.safetensors:tensor" into the file and the
// tensor's name; any other spec is a file.
func splitArraySpec(spec string) (path, tensor string) {
	if i := strings.Index(spec, ".safetensors:"); i >= 0 {
		return spec[:i+len(".safetensors")], spec[i+len(".safetensors:"):]
	}
	return spec, ""
}

// setData takes the array's elements as the bytes of b from offset on,
// which must be exactly what the shape and dtype say.
func (a *Array) setData(b []byte, offset int64, what string) error {
	n := int64(arrayWidths[a.DType])
	for _, d := range a.Shape {
		if d < 0 || (d > 0 && n > math.MaxInt64/d) {
			return fmt.Errorf("shape %v is too large", a.Shape)
		}
		n *= d
	}
	if have := int64(len(b)) - offset; offset > int64(len(b)) || have != n {
		return fmt.Errorf("the %s gives shape %v of %s (%d bytes after offset %d), the file holds %d bytes there", what, a.Shape, a.DType, n, offset, int64(len(b))-offset)
	}
	a.data = b[offset : offset+n]
	return nil
}

// openNPYArray maps a NumPy file of a dtype an Array holds, in C order.
func openNPYArray(path string) (*Array, error) {
	b, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	a := &Array{Name: path, mapped: b}
	if err := a.parseNPY(b); err != nil {
		unmap(b)
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	return a, nil
}

func (a *Array) parseNPY(b []byte) error {
	h, err := ParseNPYHeader(b)
	if err != nil {
		return err
	}
	dtype, ok := npyArrayTypes[h.Descr]
	if !ok {
		return fmt.Errorf("NumPy dtype %s: arrays hold uint8 (|u1), float16 (<f2) or float32 (<f4) features and int64 (<i8), int32 (<i4) or uint8 labels", h.Descr)
	}
	if h.Fortran {
		return errors.New("NumPy array in Fortran order: save it in C order (np.ascontiguousarray)")
	}
	a.DType, a.Shape = dtype, h.Shape
	return a.setData(b, int64(h.Offset), "NumPy header")
}

// openSafetensorsArray maps a safetensors file and takes the named tensor.
func openSafetensorsArray(path, tensor string) (*Array, error) {
	b, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	a := &Array{Name: path + ":" + tensor, mapped: b}
	if err := a.parseSafetensors(b, tensor); err != nil {
		unmap(b)
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	return a, nil
}

// parseSafetensors reads the header (an 8-byte little-endian length, then
// JSON naming each tensor's dtype, shape and byte range within the data
// after the header) and takes tensor's bytes.
func (a *Array) parseSafetensors(b []byte, tensor string) error {
	if len(b) < 8 {
		return fmt.Errorf("%d bytes, too short for a safetensors header", len(b))
	}
	n := binary.LittleEndian.Uint64(b)
	if n > uint64(len(b)-8) {
		return fmt.Errorf("header length %d does not fit the %d-byte file", n, len(b))
	}
	var header map[string]json.RawMessage
	if err := json.Unmarshal(b[8:8+n], &header); err != nil {
		return fmt.Errorf("safetensors header: %v", err)
	}
	raw, ok := header[tensor]
	if !ok || tensor == "__metadata__" {
		var names []string
		for k := range header {
			if k != "__metadata__" {
				names = append(names, k)
			}
		}
		slices.Sort(names)
		return fmt.Errorf("no tensor %q (it holds %s)", tensor, strings.Join(names, ", "))
	}
	var e struct {
		DType   string   `json:"dtype"`
		Shape   []int64  `json:"shape"`
		Offsets [2]int64 `json:"data_offsets"`
	}
	if err := json.Unmarshal(raw, &e); err != nil {
		return fmt.Errorf("tensor %s: %v", tensor, err)
	}
	dtype, ok := safetensorsTypes[e.DType]
	if !ok {
		return fmt.Errorf("tensor %s: dtype %s: arrays hold U8, F16 or F32 features and I64, I32 or U8 labels", tensor, e.DType)
	}
	a.DType, a.Shape = dtype, e.Shape
	data := b[8+n:]
	lo, hi := e.Offsets[0], e.Offsets[1]
	if lo < 0 || hi < lo || hi > int64(len(data)) {
		return fmt.Errorf("tensor %s: byte range [%d, %d) is beyond the file's %d data bytes", tensor, lo, hi, len(data))
	}
	if err := a.setData(data[:hi], lo, "header"); err != nil {
		return fmt.Errorf("tensor %s: %w", tensor, err)
	}
	return nil
}

// openIDXArray opens an IDX file of unsigned bytes: an uncompressed one is
// mapped and read in place, a gzipped one (.gz) decompressed into the heap,
// its bytes as stored (withData; else only its header is read, for checks).
func openIDXArray(path string, withData bool) (*Array, error) {
	if strings.HasSuffix(path, ".gz") {
		return readGzipIDX(path, withData)
	}
	b, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	a := &Array{Name: path, DType: "uint8", mapped: b}
	dims, _, err := readIDXHeader(bytes.NewReader(b))
	if err == nil {
		err = a.setIDXData(dims, b, int64(4+4*len(dims)))
	}
	if err != nil {
		unmap(b)
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	return a, nil
}

func (a *Array) setIDXData(dims []int, b []byte, offset int64) error {
	for _, d := range dims {
		a.Shape = append(a.Shape, int64(d))
	}
	return a.setData(b, offset, "IDX header")
}

// readGzipIDX reads a gzipped IDX file's header, and when withData its
// bytes, decompressed into an unlinked temporary file that is mapped as an
// uncompressed file is: the page cache holds them, not the heap. Where no
// temporary file can be made or written (none allowed, a full disk), the
// bytes are read into the heap.
func readGzipIDX(path string, withData bool) (*Array, error) {
	a, err := gzipIDX(path, withData, true)
	if errors.Is(err, errTempFile) {
		return gzipIDX(path, withData, false)
	}
	return a, err
}

// errTempFile is a temporary file that could not be made or written.
var errTempFile = errors.New("no temporary file")

// gzipIDX is readGzipIDX, decompressing into a temporary file when toTemp.
func gzipIDX(path string, withData, toTemp bool) (*Array, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	zr, err := gzip.NewReader(bufio.NewReaderSize(f, 1<<20))
	if err != nil {
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	defer zr.Close()
	a := &Array{Name: path, DType: "uint8"}
	dims, elems, err := readIDXHeader(zr)
	if err != nil {
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	if !withData {
		for _, d := range dims {
			a.Shape = append(a.Shape, int64(d))
		}
		return a, nil
	}
	var body []byte
	if toTemp {
		body, a.mapped, err = decompressToMap(zr, elems)
	} else {
		body, err = readIDXBody(zr, elems)
	}
	if errors.Is(err, errTempFile) {
		return nil, err
	}
	if err == nil {
		err = a.setIDXData(dims, body, 0)
	}
	if err != nil {
		a.Close()
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	return a, nil
}

// decompressToMap reads the elems bytes of an IDX file's data from r into an
// unlinked temporary file and maps it, returning the bytes and the mapping.
// A file with fewer or more bytes is an error, as ReadIDX's; a temporary
// file that cannot be made, written or mapped one wrapping errTempFile.
func decompressToMap(r io.Reader, elems int64) (body, mapped []byte, err error) {
	tmp, err := os.CreateTemp("", "pipetrain-idx-*")
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errTempFile, err)
	}
	defer os.Remove(tmp.Name())
	defer tmp.Close()
	src := &readErr{r: io.LimitReader(r, elems+1)}
	n, err := io.Copy(tmp, src)
	switch {
	case src.err != nil:
		return nil, nil, fmt.Errorf("idx: reading data: %w", src.err)
	case err != nil:
		return nil, nil, fmt.Errorf("%w: %v", errTempFile, err)
	}
	if err := idxLength(n, elems); err != nil {
		return nil, nil, err
	}
	if mapped, err = mapFile(tmp.Name()); err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errTempFile, err)
	}
	return mapped[:n], mapped, nil
}

// readErr keeps the error its reader returned, so that a copy's failure
// can be told as the reader's (the data) or the writer's.
type readErr struct {
	r   io.Reader
	err error
}

func (e *readErr) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF {
		e.err = err
	}
	return n, err
}

// findIDX is dir/name.gz, or dir/name when that is absent: Fashion-MNIST's
// files as Debian ships them (gzipped) or as a user unpacked them.
func findIDX(dir, name string) (string, error) {
	for _, p := range []string{filepath.Join(dir, name+".gz"), filepath.Join(dir, name)} {
		if _, err := os.Stat(p); err == nil {
			return p, nil
		} else if !errors.Is(err, fs.ErrNotExist) {
			return "", fmt.Errorf("data: %w", err)
		}
	}
	return "", missingFileError{filepath.Join(dir, name+".gz")}
}

// u8Scale maps a uint8 pixel to its value in [0, 1], pixel/255 in float32,
// as Fashion-MNIST's images have always been scaled.
var u8Scale = func() (t [256]float32) {
	for i := range t {
		t[i] = float32(i) / 255
	}
	return t
}()

// gatherRows copies the examples rows of a features array into dst (the
// first len(rows)·RowLen values), as float32 values converted to dst's
// type: uint8 scaled to [0, 1], float16 widened, float32 as stored.
func gatherRows[T float32 | float64](a *Array, rows []int, dst []T) {
	d := a.RowLen()
	for i, r := range rows {
		out := dst[i*d : (i+1)*d]
		switch a.DType {
		case "uint8":
			for j, p := range a.data[r*d : (r+1)*d] {
				out[j] = T(u8Scale[p])
			}
		case "float16":
			src := a.data[2*r*d : 2*(r+1)*d]
			for j := range out {
				out[j] = T(fromHalf(binary.LittleEndian.Uint16(src[2*j:])))
			}
		case "float32":
			src := a.data[4*r*d : 4*(r+1)*d]
			for j := range out {
				out[j] = T(math.Float32frombits(binary.LittleEndian.Uint32(src[4*j:])))
			}
		default:
			panic(fmt.Sprintf("data: %s: %s features", a.Name, a.DType))
		}
	}
}

// Label is the integer of example i of a labels array.
func (a *Array) Label(i int) int64 {
	switch a.DType {
	case "uint8":
		return int64(a.data[i])
	case "int32":
		return int64(int32(binary.LittleEndian.Uint32(a.data[4*i:])))
	case "int64":
		return int64(binary.LittleEndian.Uint64(a.data[8*i:]))
	}
	panic(fmt.Sprintf("data: %s: %s labels", a.Name, a.DType))
}

// fromHalf widens an IEEE 754 half-precision value (as transport's wire
// decoding does).
func fromHalf(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp == 0:
		v := float32(mant) * float32(math.Ldexp(1, -24))
		if sign != 0 {
			v = -v
		}
		return v
	}
	return math.Float32frombits(sign | (exp+127-15)<<23 | mant<<13)
}
