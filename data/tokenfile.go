package data

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// Token file formats, the values of data.token_format besides "auto".
const (
	// FormatLLMC is llm.c's shard: a header of 256 little-endian int32
	// (magic, version, token count), then the tokens.
	FormatLLMC = "llm.c"
	// FormatNanoGPT is nanoGPT's headerless little-endian array of tokens,
	// uint16 unless data.token_dtype says otherwise.
	FormatNanoGPT = "nanogpt"
	// FormatMegatron is Megatron's pair of a headerless .bin of tokens and
	// an .idx of sequence lengths, pointers and document boundaries.
	FormatMegatron = "megatron"
	// FormatNPY is a one-dimensional integer NumPy array (.npy).
	FormatNPY = "npy"
)

// TokenFormats are the values of data.token_format.
var TokenFormats = []string{"auto", FormatLLMC, FormatNanoGPT, FormatMegatron, FormatNPY}

// NanoGPTDTypes are the values of data.token_dtype, the element type of
// nanoGPT's headerless files.
var NanoGPTDTypes = []string{"uint16", "uint32"}

const (
	llmcHeaderBytes = 1024
	llmcMagicGPT2   = 20240520 // uint16 tokens
	llmcMagicLlama3 = 20240801 // uint32 tokens
)

// megatronMagic starts a Megatron index file.
var megatronMagic = []byte("MMIDIDX\x00\x00")

// megatronDTypes are the element types of Megatron's dtype codes.
var megatronDTypes = map[byte]string{1: "uint8", 2: "int8", 3: "int16", 4: "int32", 5: "int64", 6: "float64", 7: "float32", 8: "uint16"}

// intWidths are the byte widths of the integer element types a token file
// may hold.
var intWidths = map[string]int{"uint8": 1, "int8": 1, "uint16": 2, "int16": 2, "uint32": 4, "int32": 4, "int64": 8}

// TokenFile is one file of token ids, mapped into memory and read in place:
// opening it reads its header (and a Megatron pair's index), never its
// tokens.
type TokenFile struct {
	// Path is the file of tokens (a Megatron pair's .bin).
	Path string
	// Format is one of the Format constants; DType the tokens' element type.
	Format, DType string
	// Version is the header's version (llm.c, Megatron), 0 without one.
	Version int64
	// Tokens is how many tokens the file holds.
	Tokens int64
	// Sequences and Documents are a Megatron index's counts, -1 for other
	// formats.
	Sequences, Documents int64

	mapped []byte // the whole file's mapping
	body   []byte // the tokens within it
	width  int    // bytes per token
	signed bool
}

// OpenTokenFile maps the token file at path, of format (one of TokenFormats;
// "" or "auto" tells it from the magic and the extension), with nanoGPT
// files' element type dtype ("" for uint16). A Megatron pair is named by its
// .bin, its .idx or their common prefix. It checks the header against the
// file's length: a bad magic, or a file shorter or longer than its header
// says, is an error wrapping ErrBadData that names the file; a missing file
// one wrapping fs.ErrNotExist. Close releases the mapping.
func OpenTokenFile(path, format, dtype string) (*TokenFile, error) {
	if format == "" || format == "auto" {
		var err error
		if format, err = detectTokenFormat(path); err != nil {
			return nil, err
		}
	}
	if format == FormatMegatron {
		return openMegatron(path)
	}
	b, err := mapFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	f := &TokenFile{Path: path, Format: format, Sequences: -1, Documents: -1, mapped: b}
	switch format {
	case FormatLLMC:
		err = f.parseLLMC()
	case FormatNanoGPT:
		err = f.parseNanoGPT(dtype)
	case FormatNPY:
		err = f.parseNPY()
	default:
		err = fmt.Errorf("unknown token format %q (known: %s)", format, strings.Join(TokenFormats, ", "))
	}
	if err != nil {
		unmap(b)
		return nil, BadData(fmt.Errorf("data: %s: %w", path, err))
	}
	return f, nil
}

// Close releases the file's mapping; the file reads nothing after it.
func (f *TokenFile) Close() error {
	b := f.mapped
	f.mapped, f.body = nil, nil
	return unmap(b)
}

// detectTokenFormat tells a file's format: a Megatron pair by its .idx (or a
// .bin with an .idx beside it, or the prefix of the two), llm.c by its magic, NumPy by its magic, and
// any other .bin as nanoGPT's headerless tokens.
func detectTokenFormat(path string) (string, error) {
	ext := filepath.Ext(path)
	if ext == ".idx" {
		return FormatMegatron, nil
	}
	if _, err := os.Stat(path); err != nil {
		// Megatron names a pair by the prefix of its two files.
		if _, e := os.Stat(path + ".idx"); e == nil {
			return FormatMegatron, nil
		}
	}
	if ext == ".bin" {
		if _, err := os.Stat(strings.TrimSuffix(path, ext) + ".idx"); err == nil {
			return FormatMegatron, nil
		}
	}
	head, err := readHead(path, 8)
	if err != nil {
		return "", err
	}
	if len(head) >= 4 {
		switch binary.LittleEndian.Uint32(head) {
		case llmcMagicGPT2, llmcMagicLlama3:
			return FormatLLMC, nil
		}
	}
	if bytes.HasPrefix(head, []byte("\x93NUMPY")) {
		return FormatNPY, nil
	}
	if ext == ".bin" {
		return FormatNanoGPT, nil
	}
	return "", BadData(fmt.Errorf("data: %s: not a token file pipetrain recognises (no llm.c or NumPy magic, not a .bin or .idx); set data.token_format", path))
}

// readHead reads at most n bytes from the start of the file.
func readHead(path string, n int) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	defer f.Close()
	b := make([]byte, n)
	k, _ := f.Read(b)
	return b[:k], nil
}

// parseLLMC reads llm.c's header: magic, version and token count, the count
// checked against the bytes after the header.
func (f *TokenFile) parseLLMC() error {
	if len(f.mapped) < llmcHeaderBytes {
		return fmt.Errorf("%d bytes, shorter than llm.c's %d-byte header", len(f.mapped), llmcHeaderBytes)
	}
	h := func(i int) int32 { return int32(binary.LittleEndian.Uint32(f.mapped[4*i:])) }
	switch h(0) {
	case llmcMagicGPT2:
		f.DType, f.width = "uint16", 2
	case llmcMagicLlama3:
		f.DType, f.width = "uint32", 4
	default:
		return fmt.Errorf("bad magic %d: llm.c shards start with %d (uint16 tokens) or %d (uint32 tokens)", h(0), llmcMagicGPT2, llmcMagicLlama3)
	}
	f.Version = int64(h(1))
	count := int64(h(2))
	if count < 0 {
		return fmt.Errorf("header's token count %d is negative", count)
	}
	return f.setBody(llmcHeaderBytes, count, "header")
}

// setBody takes the tokens as the bytes from offset on, which must be
// exactly count tokens of f.width bytes, as what says.
func (f *TokenFile) setBody(offset int, count int64, what string) error {
	have := int64(len(f.mapped) - offset)
	want := count * int64(f.width)
	if have != want {
		word := "short"
		if have > want {
			word = "long"
		}
		return fmt.Errorf("file too %s: the %s says %d tokens (%d bytes after offset %d), the file holds %d bytes there", word, what, count, want, offset, have)
	}
	f.body, f.Tokens = f.mapped[offset:], count
	return nil
}

// parseNanoGPT takes the whole file as tokens of dtype.
func (f *TokenFile) parseNanoGPT(dtype string) error {
	if dtype == "" {
		dtype = "uint16"
	}
	w, ok := intWidths[dtype]
	if !ok {
		return fmt.Errorf("token dtype %q is not an integer type (known: %s)", dtype, strings.Join(NanoGPTDTypes, ", "))
	}
	f.DType, f.width, f.signed = dtype, w, dtype[0] == 'i'
	if len(f.mapped)%w != 0 {
		return fmt.Errorf("file too short: %d bytes is not a whole number of %d-byte %s tokens", len(f.mapped), w, dtype)
	}
	f.body, f.Tokens = f.mapped, int64(len(f.mapped)/w)
	return nil
}

// parseNPY reads a NumPy header, which must give a one-dimensional array of
// little-endian integers.
func (f *TokenFile) parseNPY() error {
	h, err := ParseNPYHeader(f.mapped)
	if err != nil {
		return err
	}
	dtype, ok := npyIntTypes[h.Descr]
	if !ok || h.Fortran || len(h.Shape) != 1 {
		return fmt.Errorf("NumPy array of %s, shape %v: token files are one-dimensional little-endian integers", h.Descr, h.Shape)
	}
	f.DType, f.width, f.signed = dtype, intWidths[dtype], dtype[0] == 'i'
	return f.setBody(h.Offset, h.Shape[0], "NumPy header")
}

// openMegatron maps a Megatron pair: the index's header and arrays are
// read and checked, the tokens of the .bin left in place.
func openMegatron(path string) (*TokenFile, error) {
	prefix := strings.TrimSuffix(strings.TrimSuffix(path, ".bin"), ".idx")
	idxPath, binPath := prefix+".idx", prefix+".bin"
	idx, err := mapFile(idxPath)
	if err != nil {
		return nil, fmt.Errorf("data: Megatron index of %s: %w", binPath, err)
	}
	defer unmap(idx)
	if _, err := os.Stat(binPath); err != nil {
		return nil, fmt.Errorf("data: Megatron tokens of %s: %w", idxPath, err)
	}
	f := &TokenFile{Path: binPath, Format: FormatMegatron}
	count, err := f.parseMegatronIndex(idx)
	if err != nil {
		return nil, BadData(fmt.Errorf("data: %s: %w", idxPath, err))
	}
	if f.mapped, err = mapFile(binPath); err != nil {
		return nil, fmt.Errorf("data: %w", err)
	}
	if err := f.setBody(0, count, "index "+filepath.Base(idxPath)); err != nil {
		f.Close()
		return nil, BadData(fmt.Errorf("data: %s: %w", binPath, err))
	}
	return f, nil
}

// parseMegatronIndex reads an index (megatron/core/datasets/indexed_dataset.py):
// magic, u64 version, u8 dtype code, u64 sequence count S, u64 document
// count D, int32[S] lengths, int64[S] byte pointers, int64[D] document
// indices (a leading 0, then each document's end). It returns the tokens the
// .bin must hold, refusing pointers that leave gaps, since the file is read
// as one stream of tokens.
func (f *TokenFile) parseMegatronIndex(idx []byte) (int64, error) {
	const fixed = 9 + 8 + 1 + 8 + 8
	if len(idx) < fixed || !bytes.Equal(idx[:9], megatronMagic) {
		return 0, fmt.Errorf("bad magic: a Megatron index starts with %q", megatronMagic)
	}
	f.Version = int64(binary.LittleEndian.Uint64(idx[9:]))
	if f.Version != 1 {
		return 0, fmt.Errorf("index version %d; pipetrain reads version 1", f.Version)
	}
	code := idx[17]
	f.DType = megatronDTypes[code]
	w, ok := intWidths[f.DType]
	if !ok {
		return 0, fmt.Errorf("dtype code %d (%s) is not an integer type", code, f.DType)
	}
	f.width, f.signed = w, f.DType[0] == 'i'
	seqs := binary.LittleEndian.Uint64(idx[18:])
	docs := binary.LittleEndian.Uint64(idx[26:])
	if seqs > uint64(len(idx)) || docs > uint64(len(idx)) || uint64(len(idx)) < fixed+12*seqs+8*docs {
		return 0, fmt.Errorf("file too short: %d bytes cannot hold %d sequences and %d document indices", len(idx), seqs, docs)
	}
	f.Sequences, f.Documents = int64(seqs), max(int64(docs)-1, 0)
	lengths, pointers := idx[fixed:], idx[fixed+4*seqs:]
	var total int64
	for i := range int64(seqs) {
		n := int64(int32(binary.LittleEndian.Uint32(lengths[4*i:])))
		p := int64(binary.LittleEndian.Uint64(pointers[8*i:]))
		if n < 0 || p != total*int64(w) {
			return 0, fmt.Errorf("sequence %d: length %d at byte %d; pipetrain reads sequences stored one after another from byte 0 (want byte %d)", i, n, p, total*int64(w))
		}
		total += n
	}
	return total, nil
}

// At returns token i of the file.
func (f *TokenFile) At(i int64) int64 {
	b := f.body[i*int64(f.width):]
	switch f.width {
	case 1:
		if f.signed {
			return int64(int8(b[0]))
		}
		return int64(b[0])
	case 2:
		v := binary.LittleEndian.Uint16(b)
		if f.signed {
			return int64(int16(v))
		}
		return int64(v)
	case 4:
		v := binary.LittleEndian.Uint32(b)
		if f.signed {
			return int64(int32(v))
		}
		return int64(v)
	}
	return int64(binary.LittleEndian.Uint64(b))
}

// ByteOffset is the offset in the file of token i's first byte.
func (f *TokenFile) ByteOffset(i int64) int64 {
	return int64(len(f.mapped)-len(f.body)) + i*int64(f.width)
}

// badToken is the error of token i, at or beyond vocab or negative.
func (f *TokenFile) badToken(i int64, vocab int) error {
	return BadData(fmt.Errorf("data: %s: token id %d at token %d (byte offset %d) is not in model.vocab's [0, %d)", f.Path, f.At(i), i, f.ByteOffset(i), vocab))
}

// CheckSample checks a sample of the file's tokens against vocab: its
// first and last blocks and blocks spread between, a few thousand tokens in
// all, so a check before a run costs little however large the file. The
// tokens a run reads are all checked as it reads them.
func (f *TokenFile) CheckSample(vocab int) error {
	const blocks, block = 16, 256
	check := func(from, to int64) error {
		for i := max(from, 0); i < min(to, f.Tokens); i++ {
			if v := f.At(i); v < 0 || v >= int64(vocab) {
				return f.badToken(i, vocab)
			}
		}
		return nil
	}
	if f.Tokens <= blocks*block {
		return check(0, f.Tokens)
	}
	for k := range int64(blocks) {
		start := k * (f.Tokens - block) / (blocks - 1)
		if err := check(start, start+block); err != nil {
			return err
		}
	}
	return nil
}

// MinMax scans every token for the smallest and largest id; it reads the
// whole file.
func (f *TokenFile) MinMax() (lo, hi int64) {
	lo, hi = math.MaxInt64, math.MinInt64
	for i := range f.Tokens {
		v := f.At(i)
		lo, hi = min(lo, v), max(hi, v)
	}
	return lo, hi
}

// NPYHeader is what a NumPy .npy file's header says.
type NPYHeader struct {
	// Descr is the array's dtype as NumPy writes it ("<u2", "|u1", "<f4").
	Descr   string
	Fortran bool
	Shape   []int64
	// Offset is where the data starts.
	Offset int
}

// npyIntTypes are the NumPy dtypes a token file may hold.
var npyIntTypes = map[string]string{"|u1": "uint8", "|i1": "int8", "<u2": "uint16", "<i2": "int16", "<u4": "uint32", "<i4": "int32", "<i8": "int64"}

// ParseNPYHeader reads the header of a .npy file from its first bytes
// (format versions 1 to 3).
func ParseNPYHeader(b []byte) (*NPYHeader, error) {
	if len(b) < 10 || !bytes.HasPrefix(b, []byte("\x93NUMPY")) {
		return nil, errors.New("not a NumPy file (no \\x93NUMPY magic)")
	}
	var n, start int
	switch b[6] {
	case 1:
		n, start = int(binary.LittleEndian.Uint16(b[8:])), 10
	case 2, 3:
		if len(b) < 12 {
			return nil, errors.New("NumPy header cut short")
		}
		n, start = int(binary.LittleEndian.Uint32(b[8:])), 12
	default:
		return nil, fmt.Errorf("NumPy format version %d", b[6])
	}
	if start+n > len(b) {
		return nil, errors.New("NumPy header cut short")
	}
	text := string(b[start : start+n])
	h := &NPYHeader{Offset: start + n}
	descr, ok := npyField(text, "descr")
	if !ok {
		return nil, fmt.Errorf("NumPy header %q has no descr", text)
	}
	h.Descr = strings.Trim(descr, `'"`)
	fortran, _ := npyField(text, "fortran_order")
	h.Fortran = strings.HasPrefix(fortran, "True")
	shape, ok := npyField(text, "shape")
	if !ok || !strings.HasPrefix(shape, "(") {
		return nil, fmt.Errorf("NumPy header %q has no shape", text)
	}
	shape = strings.TrimSuffix(shape[1:], ")")
	for _, d := range strings.Split(shape, ",") {
		if d = strings.TrimSpace(d); d == "" {
			continue
		}
		v, err := strconv.ParseInt(d, 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("NumPy header's shape (%s)", shape)
		}
		h.Shape = append(h.Shape, v)
	}
	return h, nil
}

// npyField returns the value of key in a NumPy header's dict: a quoted
// string with its quotes, a tuple with its parentheses, or a word.
func npyField(text, key string) (string, bool) {
	for _, q := range []string{"'", `"`} {
		_, after, ok := strings.Cut(text, q+key+q)
		if !ok {
			continue
		}
		v := strings.TrimSpace(strings.TrimPrefix(strings.TrimSpace(after), ":"))
		end := strings.IndexAny(v, ",}")
		switch {
		case v == "":
		case v[0] == '\'' || v[0] == '"':
			end = strings.IndexByte(v[1:], v[0]) + 2
		case v[0] == '(':
			end = strings.IndexByte(v, ')') + 1
		}
		if end <= 0 {
			return "", false
		}
		return v[:end], true
	}
	return "", false
}
