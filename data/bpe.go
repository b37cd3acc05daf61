package data

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"
)

// BPETokenizer is a byte-level BPE tokenizer read from a Hugging Face
// tokenizer.json, as GPT-2's and its descendants' are: text is split on the
// added tokens ("<|endoftext|>"), each piece cut into words by GPT-2's
// pattern, each word's bytes spelled in the bytes-to-unicode alphabet and
// merged pairwise by rank. It is a pure function of the file, so every
// process that reads the same file agrees on the ids. It remembers the words
// it has merged, so one BPETokenizer serves one goroutine.
type BPETokenizer struct {
	vocab  map[string]int32 // token (in the byte alphabet) -> id
	tokens map[int32][]byte // id -> its bytes
	byteID [256]int32       // the id of each single byte
	merges map[[2]int32]bpeMerge
	added  []addedToken // longest first
	prefix bool         // ByteLevel's add_prefix_space
	split  bool         // ByteLevel's use_regex
	size   int
	cache  map[string][]int32
}

// bpeMerge is what one pair of tokens merges into, and the merge's rank:
// lower ranks merge first.
type bpeMerge struct {
	rank int
	id   int32
}

type addedToken struct {
	content []byte
	id      int32
}

// hfTokenizer is the part of a tokenizer.json BPETokenizer reads.
type hfTokenizer struct {
	AddedTokens []struct {
		ID         int32  `json:"id"`
		Content    string `json:"content"`
		SingleWord bool   `json:"single_word"`
		LStrip     bool   `json:"lstrip"`
		RStrip     bool   `json:"rstrip"`
	} `json:"added_tokens"`
	Normalizer   *hfComponent `json:"normalizer"`
	PreTokenizer *hfComponent `json:"pre_tokenizer"`
	Decoder      *hfComponent `json:"decoder"`
	Model        struct {
		Type                    string           `json:"type"`
		Dropout                 *float64         `json:"dropout"`
		ContinuingSubwordPrefix *string          `json:"continuing_subword_prefix"`
		EndOfWordSuffix         *string          `json:"end_of_word_suffix"`
		ByteFallback            bool             `json:"byte_fallback"`
		IgnoreMerges            bool             `json:"ignore_merges"`
		Vocab                   map[string]int32 `json:"vocab"`
		Merges                  []json.RawMessage
	} `json:"model"`
}

type hfComponent struct {
	Type           string `json:"type"`
	AddPrefixSpace bool   `json:"add_prefix_space"`
	UseRegex       *bool  `json:"use_regex"`
}

// LoadBPETokenizer reads a Hugging Face tokenizer.json.
func LoadBPETokenizer(path string) (*BPETokenizer, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer: %w", err)
	}
	t, err := ParseBPETokenizer(b)
	if err != nil {
		return nil, fmt.Errorf("data: tokenizer %s: %w", path, err)
	}
	return t, nil
}

// ParseBPETokenizer reads the text of a tokenizer.json. It refuses, by
// name, what it does not implement: models other than BPE, any normalizer,
// pre-tokenizers and decoders other than ByteLevel, dropout, subword
// prefixes and suffixes, byte fallback, ignore_merges, added tokens that
// strip or match whole words. A post-processor is ignored: shards are a stream of text, not
// sentences to wrap in special tokens.
func ParseBPETokenizer(b []byte) (*BPETokenizer, error) {
	var h hfTokenizer
	if err := json.Unmarshal(b, &h); err != nil {
		return nil, err
	}
	if err := h.supported(); err != nil {
		return nil, err
	}
	t := &BPETokenizer{vocab: h.Model.Vocab, tokens: map[int32][]byte{}, merges: map[[2]int32]bpeMerge{}, split: true, cache: map[string][]int32{}}
	if p := h.PreTokenizer; p != nil {
		t.prefix = p.AddPrefixSpace
		t.split = p.UseRegex == nil || *p.UseRegex
	}
	addedIDs := map[string]bool{}
	for _, a := range h.AddedTokens {
		addedIDs[a.Content] = true
	}
	for tok, id := range t.vocab {
		bs, ok := fromByteAlphabet(tok)
		if addedIDs[tok] {
			// An added token is text as written, not spelled in the alphabet.
			bs, ok = []byte(tok), true
		}
		if !ok {
			return nil, fmt.Errorf("model.vocab: token %q (id %d) is not spelled in the byte-level alphabet", tok, id)
		}
		if id < 0 {
			return nil, fmt.Errorf("model.vocab: token %q has negative id %d", tok, id)
		}
		t.tokens[id] = bs
		t.size = max(t.size, int(id)+1)
	}
	for c := range 256 {
		id, ok := t.vocab[string(byteAlphabet[c])]
		if !ok {
			return nil, fmt.Errorf("model.vocab: has no token for byte 0x%02x (%q); a byte-level vocabulary holds all 256", c, byteAlphabet[c])
		}
		t.byteID[c] = id
	}
	for i, raw := range h.Model.Merges {
		a, b, err := mergePair(raw)
		if err != nil {
			return nil, fmt.Errorf("model.merges[%d]: %w", i, err)
		}
		ia, oka := t.vocab[a]
		ib, okb := t.vocab[b]
		im, okm := t.vocab[a+b]
		if !oka || !okb || !okm {
			return nil, fmt.Errorf("model.merges[%d]: %q %q: a part or the merged token is not in model.vocab", i, a, b)
		}
		if _, dup := t.merges[[2]int32{ia, ib}]; !dup {
			t.merges[[2]int32{ia, ib}] = bpeMerge{rank: i, id: im}
		}
	}
	for _, a := range h.AddedTokens {
		if a.SingleWord || a.LStrip || a.RStrip {
			return nil, fmt.Errorf("added_tokens: %q: single_word, lstrip and rstrip are not supported", a.Content)
		}
		if a.Content == "" {
			return nil, fmt.Errorf("added_tokens: id %d has no content", a.ID)
		}
		t.added = append(t.added, addedToken{[]byte(a.Content), a.ID})
		t.tokens[a.ID] = []byte(a.Content)
		t.size = max(t.size, int(a.ID)+1)
	}
	slices.SortStableFunc(t.added, func(x, y addedToken) int { return len(y.content) - len(x.content) })
	return t, nil
}

// supported refuses the parts of a tokenizer.json BPETokenizer does not
// implement, naming the part.
func (h *hfTokenizer) supported() error {
	switch {
	case h.Model.Type != "BPE":
		return fmt.Errorf("model.type %q: only BPE is supported", h.Model.Type)
	case h.Normalizer != nil:
		return fmt.Errorf("normalizer %q: no normalizer is supported", h.Normalizer.Type)
	case h.PreTokenizer == nil || h.PreTokenizer.Type != "ByteLevel":
		name := "none"
		if h.PreTokenizer != nil {
			name = h.PreTokenizer.Type
		}
		return fmt.Errorf("pre_tokenizer %q: only ByteLevel (GPT-2's) is supported", name)
	case h.Decoder != nil && h.Decoder.Type != "ByteLevel":
		return fmt.Errorf("decoder %q: only ByteLevel is supported", h.Decoder.Type)
	case h.Model.Dropout != nil && *h.Model.Dropout != 0:
		return fmt.Errorf("model.dropout %v: BPE dropout is not supported", *h.Model.Dropout)
	case h.Model.ContinuingSubwordPrefix != nil && *h.Model.ContinuingSubwordPrefix != "":
		return fmt.Errorf("model.continuing_subword_prefix %q is not supported", *h.Model.ContinuingSubwordPrefix)
	case h.Model.EndOfWordSuffix != nil && *h.Model.EndOfWordSuffix != "":
		return fmt.Errorf("model.end_of_word_suffix %q is not supported", *h.Model.EndOfWordSuffix)
	case h.Model.ByteFallback:
		return fmt.Errorf("model.byte_fallback is not supported")
	case h.Model.IgnoreMerges:
		return fmt.Errorf("model.ignore_merges is not supported")
	}
	return nil
}

// mergePair reads one merge, written "a b" (older files) or ["a", "b"].
func mergePair(raw json.RawMessage) (string, string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		a, b, ok := strings.Cut(s, " ")
		if !ok {
			return "", "", fmt.Errorf("%q is not two tokens", s)
		}
		return a, b, nil
	}
	var pair []string
	if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
		return "", "", fmt.Errorf("%s is not two tokens", raw)
	}
	return pair[0], pair[1], nil
}

// Vocab is one more than the largest id, added tokens included.
func (t *BPETokenizer) Vocab() int { return t.size }

// Encode gives the ids of text. Every byte sequence encodes, since each
// byte has a token.
func (t *BPETokenizer) Encode(text []byte) ([]int32, error) {
	return t.encode(nil, text, true), nil
}

// encode appends the ids of text to ids. first says text starts a stream,
// the only place add_prefix_space adds a space.
func (t *BPETokenizer) encode(ids []int32, text []byte, first bool) []int32 {
	for len(text) > 0 {
		at, a := t.nextAdded(text)
		ids = t.encodeSegment(ids, text[:at], first)
		if a == nil {
			break
		}
		ids = append(ids, a.id)
		text, first = text[at+len(a.content):], true
	}
	return ids
}

// nextAdded finds the first added token in text, the longest where several
// start at the same byte; at is len(text) when there is none.
func (t *BPETokenizer) nextAdded(text []byte) (at int, a *addedToken) {
	at = len(text)
	for i := range t.added {
		k := bytes.Index(text[:min(len(text), at+len(t.added[i].content))], t.added[i].content)
		if k >= 0 && (k < at || a == nil && k == at) {
			at, a = k, &t.added[i]
		}
	}
	return at, a
}

// encodeSegment encodes text that holds no added token.
func (t *BPETokenizer) encodeSegment(ids []int32, text []byte, first bool) []int32 {
	if len(text) == 0 {
		return ids
	}
	if t.prefix && first && text[0] != ' ' {
		text = append([]byte{' '}, text...)
	}
	if !t.split {
		return append(ids, t.word(text)...)
	}
	for len(text) > 0 {
		n := gpt2Word(text)
		ids = append(ids, t.word(text[:n])...)
		text = text[n:]
	}
	return ids
}

// word merges the bytes of one word, remembering the words it has seen:
// text repeats its words, and merging costs a pass over the word per merge.
func (t *BPETokenizer) word(w []byte) []int32 {
	if ids, ok := t.cache[string(w)]; ok {
		return ids
	}
	syms := make([]int32, len(w))
	for i, c := range w {
		syms[i] = t.byteID[c]
	}
	for len(syms) > 1 {
		best, rank := -1, 0
		for i := 0; i+1 < len(syms); i++ {
			if m, ok := t.merges[[2]int32{syms[i], syms[i+1]}]; ok && (best < 0 || m.rank < rank) {
				best, rank = i, m.rank
			}
		}
		if best < 0 {
			break
		}
		// Merge every occurrence of the pair, left to right, as GPT-2 does.
		pair := [2]int32{syms[best], syms[best+1]}
		merged := t.merges[pair].id
		out := syms[:0:0]
		for i := 0; i < len(syms); i++ {
			if i+1 < len(syms) && syms[i] == pair[0] && syms[i+1] == pair[1] {
				out = append(out, merged)
				i++
			} else {
				out = append(out, syms[i])
			}
		}
		syms = out
	}
	if len(t.cache) >= 1<<16 {
		clear(t.cache)
	}
	t.cache[string(w)] = syms
	return syms
}

// Decode gives the bytes of ids: a vocabulary token's bytes, an added
// token's text.
func (t *BPETokenizer) Decode(ids []int32) ([]byte, error) {
	var out []byte
	for i, id := range ids {
		b, ok := t.tokens[id]
		if !ok {
			return nil, fmt.Errorf("data: token id %d at position %d is not in the tokenizer's vocabulary", id, i)
		}
		out = append(out, b...)
	}
	return out, nil
}

// gpt2Word is the length of the first word of text as GPT-2's pattern
// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
// cuts it, written out since Go's regexp has no lookahead. A byte that is
// not UTF-8 counts as a symbol, neither letter, number nor space.
func gpt2Word(text []byte) int {
	r, n := utf8.DecodeRune(text)
	if r == '\'' {
		for _, c := range []string{"s", "t", "re", "ve", "m", "ll", "d"} {
			if strings.HasPrefix(string(text[1:min(len(text), 3)]), c) {
				return 1 + len(c)
			}
		}
	}
	start := 0
	if r == ' ' && len(text) > 1 {
		if next, _ := utf8.DecodeRune(text[1:]); !unicode.IsSpace(next) {
			start, r = 1, next
		}
	}
	if start == 1 || !unicode.IsSpace(r) {
		class := runeClass(r)
		end := start
		for end < len(text) {
			c, k := utf8.DecodeRune(text[end:])
			if runeClass(c) != class {
				break
			}
			end += k
		}
		return end
	}
	// A run of spaces: all of it at the end of the text; before anything
	// else, all but its last space, which goes with what follows, unless the
	// run is that one space.
	end, last := 0, n
	for end < len(text) {
		c, k := utf8.DecodeRune(text[end:])
		if !unicode.IsSpace(c) {
			break
		}
		end, last = end+k, k
	}
	if end < len(text) && end > last {
		return end - last
	}
	return end
}

// runeClass is which of GPT-2's pattern's classes r falls in: letter,
// number, space or other.
func runeClass(r rune) int {
	switch {
	case unicode.IsLetter(r):
		return 0
	case unicode.IsNumber(r):
		return 1
	case unicode.IsSpace(r):
		return 2
	}
	return 3
}

// byteAlphabet is GPT-2's bytes_to_unicode: printable Latin-1 bytes stand
// for themselves, the others for the code points from 256 on, in order, so
// every byte has a visible character that no pre-tokenizer splits.
var byteAlphabet, alphabetByte = func() ([256]rune, map[rune]byte) {
	var to [256]rune
	from := map[rune]byte{}
	n := 0
	for b := range 256 {
		r := rune(b)
		if !(b >= '!' && b <= '~' || b >= 0xA1 && b <= 0xAC || b >= 0xAE && b <= 0xFF) {
			r = rune(256 + n)
			n++
		}
		to[b], from[r] = r, byte(b)
	}
	return to, from
}()

// fromByteAlphabet reads a token spelled in byteAlphabet back into bytes.
func fromByteAlphabet(tok string) ([]byte, bool) {
	out := make([]byte, 0, len(tok))
	for _, r := range tok {
		b, ok := alphabetByte[r]
		if !ok {
			return nil, false
		}
		out = append(out, b)
	}
	return out, true
}
