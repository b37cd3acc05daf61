package data

import (
	"bufio"
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
	"unicode"
	"unicode/utf8"
)

// TokenizerFile is the file beside the shards that records their tokenizer,
// which pipetrain sample decodes with: a Hugging Face tokenizer.json as
// given, or for the byte and char tokenizers a small file of pipetrain's
// (see SaveTokenizer).
const TokenizerFile = "tokenizer.json"

// DefaultShardTokens is how many tokens a shard holds, llm.c's 10⁸.
const DefaultShardTokens = 100_000_000

// TokenizeOptions says how Tokenize writes its shards.
type TokenizeOptions struct {
	// Tokenizer is "byte", "char" (the bytes the input uses) or the path of
	// a Hugging Face tokenizer.json.
	Tokenizer string
	// Out is the folder of the shards.
	Out string
	// ShardTokens caps a shard's tokens (0: DefaultShardTokens).
	ShardTokens int64
	// ValFraction of the input's bytes, taken from its end, become the
	// validation shards, as dataset text holds out its last tokens.
	ValFraction float64
	// Force replaces the shards and tokenizer a folder holds already.
	Force bool
	// Progress, when set, receives a progress bar if the input holds at
	// least ProgressFrom bytes: redrawn in place when Live, otherwise a line
	// per tenth.
	Progress     io.Writer
	ProgressFrom int64
	Live         bool
}

// Shard is one file Tokenize wrote.
type Shard struct {
	Path   string
	Tokens int64
}

// Tokenized is what Tokenize wrote.
type Tokenized struct {
	Train, Val []Shard
	// Tokenizer is the file recording the tokenizer; Vocab its ids.
	Tokenizer string
	Vocab     int
	// Bytes is the input's size.
	Bytes int64
}

// Tokenize encodes the text files (or folders of them, walked as dataset
// text walks data.corpus) at inputs, read in order as one stream, into
// llm.c shards in o.Out: train_000000.bin, ... and, when o.ValFraction > 0,
// val_000000.bin, ..., uint16 tokens (magic 20240520) when the vocabulary
// fits 65536 ids and uint32 (20240801) otherwise, beside the tokenizer
// (TokenizerFile). The input is read in pieces, never whole; each file is
// written under a temporary name and renamed when complete. With the byte
// or char tokenizer the shards hold exactly the training and validation
// tokens dataset text makes of the same input and fraction.
func Tokenize(inputs []string, o TokenizeOptions) (*Tokenized, error) {
	if o.ValFraction < 0 || o.ValFraction >= 1 {
		return nil, fmt.Errorf("data: validation fraction %v out of range [0, 1)", o.ValFraction)
	}
	if o.ShardTokens == 0 {
		o.ShardTokens = DefaultShardTokens
	}
	if o.ShardTokens < 1 || o.ShardTokens > math.MaxInt32 {
		return nil, fmt.Errorf("data: shard tokens %d out of range [1, %d] (llm.c's header counts in int32)", o.ShardTokens, math.MaxInt32)
	}
	files, total, err := inputFiles(inputs)
	if err != nil {
		return nil, err
	}
	tok, spec, err := tokenizerFor(o.Tokenizer, files)
	if err != nil {
		return nil, err
	}
	if err := prepareOut(o.Out, o.Force); err != nil {
		return nil, err
	}
	res := &Tokenized{Vocab: tok.Vocab(), Bytes: total, Tokenizer: filepath.Join(o.Out, TokenizerFile)}
	cut := total - int64(float64(total)*o.ValFraction)
	train := newShardWriter(o.Out, "train", tok.Vocab(), o.ShardTokens)
	val := newShardWriter(o.Out, "val", tok.Vocab(), o.ShardTokens)
	defer train.abort()
	defer val.abort()
	enc := newStreamEncoder(tok, train)
	bar := newProgressBar(o, total)
	var at int64
	for _, name := range files {
		if err := forEachPiece(name, func(p []byte) error {
			bar.advance(int64(len(p)))
			if at < cut && at+int64(len(p)) > cut {
				k := cut - at
				if err := enc.write(p[:k]); err != nil {
					return err
				}
				p, at = p[k:], cut
			}
			if at == cut && enc.out == train {
				if err := enc.close(); err != nil {
					return err
				}
				enc = newStreamEncoder(tok, val)
			}
			at += int64(len(p))
			return enc.write(p)
		}); err != nil {
			return nil, fmt.Errorf("data: %s: %w", name, err)
		}
	}
	bar.done()
	if err := enc.close(); err != nil {
		return nil, err
	}
	if enc.out == train && o.ValFraction > 0 {
		return nil, fmt.Errorf("data: a validation fraction of %v of %d bytes is no byte; give more text or --val-fraction 0", o.ValFraction, total)
	}
	if len(train.shards) == 0 {
		return nil, fmt.Errorf("data: the input's first %d bytes give no training token", cut)
	}
	if err := writeAtomic(res.Tokenizer, spec); err != nil {
		return nil, err
	}
	res.Train, res.Val = train.shards, val.shards
	train.shards, val.shards = nil, nil
	return res, nil
}

// inputFiles lists the files of inputs in order, a folder's sorted as
// dataset text sorts them, and their total size.
func inputFiles(inputs []string) ([]string, int64, error) {
	if len(inputs) == 0 {
		return nil, 0, errors.New("data: no text to tokenize")
	}
	var files []string
	var total int64
	for _, in := range inputs {
		found, err := corpusFiles(in, "")
		if err != nil {
			return nil, 0, err
		}
		for _, f := range found {
			info, err := os.Stat(f)
			if err != nil {
				return nil, 0, fmt.Errorf("data: %w", err)
			}
			total += info.Size()
		}
		files = append(files, found...)
	}
	if total == 0 {
		return nil, 0, fmt.Errorf("data: %s: no text (0 bytes)", strings.Join(inputs, ", "))
	}
	return files, total, nil
}

// tokenizerFor builds the tokenizer name says, and the text of the file
// that records it.
func tokenizerFor(name string, files []string) (Tokenizer, []byte, error) {
	switch name {
	case "byte":
		return ByteTokenizer{}, SaveTokenizer(ByteTokenizer{}), nil
	case "char":
		var seen [256]bool
		if _, err := scanCorpus(files, 0, &seen); err != nil {
			return nil, nil, err
		}
		tok, err := charTokenizer(&seen)
		if err != nil {
			return nil, nil, err
		}
		return tok, SaveTokenizer(tok), nil
	case "":
		return nil, nil, errors.New("data: no tokenizer given: byte, char or a tokenizer.json")
	}
	spec, err := os.ReadFile(name)
	if err != nil {
		return nil, nil, fmt.Errorf("data: tokenizer: %w", err)
	}
	tok, err := ParseBPETokenizer(spec)
	if err != nil {
		return nil, nil, fmt.Errorf("data: tokenizer %s: %w", name, err)
	}
	return tok, spec, nil
}

// prepareOut makes the folder of the shards; one that holds shards or a
// tokenizer already is refused, naming the file, unless force, which
// removes them: a glob of train_*.bin would read a longer earlier run's
// leftover shards as part of this one.
func prepareOut(dir string, force bool) error {
	if dir == "" {
		return errors.New("data: no output folder given")
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("data: %w", err)
	}
	var old []string
	for _, pattern := range []string{"train_*.bin", "val_*.bin", TokenizerFile} {
		m, _ := filepath.Glob(filepath.Join(dir, pattern))
		old = append(old, m...)
	}
	if len(old) == 0 {
		return nil
	}
	if !force {
		return fmt.Errorf("data: %s holds %s already (--force replaces it)", dir, old[0])
	}
	for _, f := range old {
		if err := os.Remove(f); err != nil {
			return fmt.Errorf("data: %w", err)
		}
	}
	return nil
}

// pieceBytes is how much of a file Tokenize reads at a time.
var pieceBytes = 1 << 20

// forEachPiece reads the file at name in pieces of pieceBytes.
func forEachPiece(name string, f func([]byte) error) error {
	in, err := os.Open(name)
	if err != nil {
		return err
	}
	defer in.Close()
	buf := make([]byte, pieceBytes)
	for {
		n, err := io.ReadFull(in, buf)
		if n > 0 {
			if err := f(buf[:n]); err != nil {
				return err
			}
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return nil
		}
		if err != nil {
			return err
		}
	}
}

// streamEncoder encodes a stream of text given in pieces into a
// shardWriter. The byte and char tokenizers encode each byte alone; a BPE
// tokenizer encodes up to a cut whose tokens do not depend on the text
// after it (bpeCut), keeping the rest for the next piece.
type streamEncoder struct {
	tok   Tokenizer
	bpe   *BPETokenizer
	carry []byte
	first bool
	out   *shardWriter
}

func newStreamEncoder(tok Tokenizer, out *shardWriter) *streamEncoder {
	bpe, _ := tok.(*BPETokenizer)
	return &streamEncoder{tok: tok, bpe: bpe, first: true, out: out}
}

func (e *streamEncoder) write(p []byte) error {
	if e.bpe == nil {
		ids, err := e.tok.Encode(p)
		if err != nil {
			return err
		}
		return e.out.add(ids)
	}
	from := len(e.carry)
	e.carry = append(e.carry, p...)
	cut := e.bpe.safeCut(e.carry, from)
	if cut == 0 {
		return nil
	}
	ids := e.bpe.encode(nil, e.carry[:cut], e.first)
	e.first = false
	e.carry = append(e.carry[:0], e.carry[cut:]...)
	return e.out.add(ids)
}

// close encodes what is left and completes the last shard.
func (e *streamEncoder) close() error {
	if e.bpe != nil && len(e.carry) > 0 {
		if err := e.out.add(e.bpe.encode(nil, e.carry, e.first)); err != nil {
			return err
		}
		e.carry = nil
	}
	return e.out.finish()
}

// safeCut is the last place in text where encoding stops and starts again
// without changing a token, 0 for none, looking only at newlines from byte
// from-5 on (text before from was looked at already, but for the character
// after it): after one that follows a
// character other than a space and precedes one. GPT-2's pattern ends a
// word there in any text (the newline is a word of its own, whatever
// follows the next character), and no added token spans it unless one holds
// a newline.
func (t *BPETokenizer) safeCut(text []byte, from int) int {
	for _, a := range t.added {
		if slices.Contains(a.content, '\n') {
			return 0
		}
	}
	for i := len(text) - 2; i >= max(1, from-utf8.UTFMax-1); i-- {
		if text[i] != '\n' {
			continue
		}
		before, _ := utf8.DecodeLastRune(text[:i])
		after, _ := utf8.DecodeRune(text[i+1:])
		if !unicode.IsSpace(before) && !unicode.IsSpace(after) && after != utf8.RuneError {
			return i + 1
		}
	}
	return 0
}

// shardWriter writes one split's tokens into llm.c shards of at most limit
// tokens: DIR/SPLIT_000000.bin, ... Each is written under a temporary name,
// its header's count filled in at the end, and renamed when complete.
type shardWriter struct {
	dir, split string
	magic      int32
	version    int32
	width      int
	limit      int64
	shards     []Shard // renamed and complete
	f          *os.File
	w          *bufio.Writer
	n          int64 // tokens in the open shard
	buf        []byte
}

func newShardWriter(dir, split string, vocab int, limit int64) *shardWriter {
	w := &shardWriter{dir: dir, split: split, magic: llmcMagicGPT2, version: 1, width: 2, limit: limit}
	if vocab > 1<<16 {
		w.magic, w.version, w.width = llmcMagicLlama3, 7, 4
	}
	return w
}

// add appends ids, opening a new shard whenever one fills.
func (w *shardWriter) add(ids []int32) error {
	for len(ids) > 0 {
		if w.f == nil {
			if err := w.open(); err != nil {
				return err
			}
		}
		k := min(int64(len(ids)), w.limit-w.n)
		w.buf = w.buf[:0]
		for _, id := range ids[:k] {
			if w.width == 2 {
				w.buf = binary.LittleEndian.AppendUint16(w.buf, uint16(id))
			} else {
				w.buf = binary.LittleEndian.AppendUint32(w.buf, uint32(id))
			}
		}
		if _, err := w.w.Write(w.buf); err != nil {
			return fmt.Errorf("writing %s: %w", w.f.Name(), err)
		}
		w.n += k
		ids = ids[k:]
		if w.n == w.limit {
			if err := w.finish(); err != nil {
				return err
			}
		}
	}
	return nil
}

// open starts the next shard with a header whose count finish fills in.
func (w *shardWriter) open() error {
	name := w.path(len(w.shards))
	f, err := os.CreateTemp(w.dir, "."+filepath.Base(name)+".tmp-*")
	if err != nil {
		return err
	}
	w.f, w.w, w.n = f, bufio.NewWriterSize(f, 1<<20), 0
	_, err = w.w.Write(make([]byte, llmcHeaderBytes))
	return err
}

func (w *shardWriter) path(i int) string {
	return filepath.Join(w.dir, fmt.Sprintf("%s_%06d.bin", w.split, i))
}

// finish completes the open shard, if any: header, sync, rename.
func (w *shardWriter) finish() error {
	if w.f == nil {
		return nil
	}
	header := make([]byte, llmcHeaderBytes)
	binary.LittleEndian.PutUint32(header[0:], uint32(w.magic))
	binary.LittleEndian.PutUint32(header[4:], uint32(w.version))
	binary.LittleEndian.PutUint32(header[8:], uint32(w.n))
	name := w.path(len(w.shards))
	err := w.w.Flush()
	if err == nil {
		_, err = w.f.WriteAt(header, 0)
	}
	if err == nil {
		err = w.f.Sync()
	}
	if cerr := w.f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(w.f.Name(), name)
	}
	if err != nil {
		os.Remove(w.f.Name())
		w.f = nil
		return fmt.Errorf("writing %s: %w", name, err)
	}
	w.f = nil
	w.shards = append(w.shards, Shard{Path: name, Tokens: w.n})
	return nil
}

// abort removes the open shard's temporary file and the shards written,
// after a failure: a folder half written would train on part of the text.
func (w *shardWriter) abort() {
	if w.f != nil {
		w.f.Close()
		os.Remove(w.f.Name())
		w.f = nil
	}
	for _, s := range w.shards {
		os.Remove(s.Path)
	}
}

// writeAtomic writes b to path under a temporary name and renames it.
func writeAtomic(path string, b []byte) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return err
	}
	_, err = f.Write(b)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(f.Name(), 0o644)
	}
	if err == nil {
		err = os.Rename(f.Name(), path)
	}
	if err != nil {
		os.Remove(f.Name())
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

// progressBar draws how much of the input has been read.
type progressBar struct {
	w          io.Writer
	live       bool
	total, at  int64
	shown      int // the last tenth (or hundredth, live) drawn
	resolution int
}

func newProgressBar(o TokenizeOptions, total int64) *progressBar {
	b := &progressBar{total: total, shown: -1, live: o.Live, resolution: 10}
	if o.Progress != nil && total >= o.ProgressFrom {
		b.w = o.Progress
	}
	if b.live {
		b.resolution = 100
	}
	return b
}

func (b *progressBar) advance(n int64) {
	if b.w == nil {
		return
	}
	b.at += n
	step := int(b.at * int64(b.resolution) / b.total)
	if step == b.shown {
		return
	}
	b.shown = step
	pct := step * 100 / b.resolution
	bar := strings.Repeat("#", pct/5) + strings.Repeat(".", 20-pct/5)
	line := fmt.Sprintf("tokenizing [%s] %3d%% %s of %s", bar, pct, mib(b.at), mib(b.total))
	if b.live {
		fmt.Fprintf(b.w, "\r%s", line)
	} else {
		fmt.Fprintln(b.w, line)
	}
}

func (b *progressBar) done() {
	if b.w != nil && b.live {
		fmt.Fprintln(b.w)
	}
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// pipetrainTokenizer is the file recording the byte or char tokenizer.
type pipetrainTokenizer struct {
	Tokenizer string `json:"pipetrain_tokenizer"`
	// Symbols are the char tokenizer's bytes, in id order.
	Symbols []int `json:"symbols,omitempty"`
}

// SaveTokenizer is the text of the file recording a byte or char
// tokenizer, which LoadTokenizer reads back.
func SaveTokenizer(tok Tokenizer) []byte {
	spec := pipetrainTokenizer{Tokenizer: "byte"}
	if c, ok := tok.(*CharTokenizer); ok {
		spec.Tokenizer = "char"
		for _, s := range c.symbols {
			spec.Symbols = append(spec.Symbols, int(s))
		}
	}
	b, _ := json.Marshal(spec)
	return append(b, '\n')
}

// LoadTokenizer reads a tokenizer file: pipetrain's record of a byte or
// char tokenizer, or a Hugging Face tokenizer.json.
func LoadTokenizer(path string) (Tokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer: %w", err)
	}
	var spec pipetrainTokenizer
	if json.Unmarshal(b, &spec) == nil && spec.Tokenizer != "" {
		switch spec.Tokenizer {
		case "byte":
			return ByteTokenizer{}, nil
		case "char":
			var seen [256]bool
			for _, s := range spec.Symbols {
				if s < 0 || s > 255 {
					return nil, fmt.Errorf("data: tokenizer %s: symbol %d is not a byte", path, s)
				}
				seen[s] = true
			}
			tok, err := charTokenizer(&seen)
			if err != nil {
				return nil, fmt.Errorf("data: tokenizer %s: %w", path, err)
			}
			return tok, nil
		}
		return nil, fmt.Errorf("data: tokenizer %s: unknown pipetrain_tokenizer %q (known: byte, char)", path, spec.Tokenizer)
	}
	tok, err := ParseBPETokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer %s: %w", path, err)
	}
	return tok, nil
}

// ShardTokenizer finds the tokenizer of a tokens dataset: TokenizerFile in
// the folder of data.train_shards's first file. It returns the file's path
// too; a folder without one is an error wrapping fs.ErrNotExist.
func ShardTokenizer(s *Section) (Tokenizer, string, error) {
	k := tokensKind{}.keys(s)
	paths, err := shardPaths(s, k.TrainShards)
	if err != nil {
		return nil, "", fmt.Errorf("%s: data.train_shards: %w", s.Config, err)
	}
	path := filepath.Join(filepath.Dir(paths[0]), TokenizerFile)
	if _, err := os.Stat(path); err != nil {
		return nil, "", fmt.Errorf("%s: data.train_shards: no %s beside %s (pipetrain data tokenize writes one): %w", s.Config, TokenizerFile, paths[0], fs.ErrNotExist)
	}
	tok, err := LoadTokenizer(path)
	return tok, path, err
}
