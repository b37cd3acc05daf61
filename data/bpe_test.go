package data

import (
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/internal/testenv"
)

// tokenizerJSON writes a GPT-2-style tokenizer.json: the 256 bytes as ids 0
// to 255 in byte order, then one token per merge, then the added tokens.
func tokenizerJSON(merges [][2]string, added ...string) []byte {
	vocab := map[string]int{}
	for b := range 256 {
		vocab[string(byteAlphabet[b])] = b
	}
	var ms []string
	for _, m := range merges {
		if _, ok := vocab[m[0]+m[1]]; !ok {
			vocab[m[0]+m[1]] = len(vocab)
		}
		ms = append(ms, m[0]+" "+m[1])
	}
	var at []map[string]any
	for _, a := range added {
		at = append(at, map[string]any{"id": len(vocab), "content": a, "single_word": false, "lstrip": false, "rstrip": false, "normalized": true, "special": true})
		vocab[a] = len(vocab)
	}
	b, _ := json.Marshal(map[string]any{
		"version": "1.0", "added_tokens": at, "normalizer": nil,
		"pre_tokenizer":  map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true},
		"post_processor": map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false, "use_regex": true},
		"decoder":        map[string]any{"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": true, "use_regex": true},
		"model":          map[string]any{"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": "", "end_of_word_suffix": "", "fuse_unk": false, "byte_fallback": false, "vocab": vocab, "merges": ms},
	})
	return b
}

// smallMerges spell " the", " cat", "in" and "ing" in GPT-2's alphabet (Ġ
// is the space).
var smallMerges = [][2]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}, {"i", "n"}, {"Ġ", "c"}, {"a", "t"}, {"Ġc", "at"}, {"in", "g"}}

// words splits text as GPT-2's pattern does.
func words(text string) []string {
	var out []string
	for b := []byte(text); len(b) > 0; {
		n := gpt2Word(b)
		out, b = append(out, string(b[:n])), b[n:]
	}
	return out
}

// TestGPT2Words: the pattern's cases, worked out by hand from the regular
// expression: contractions, an optional space before letters, numbers and
// symbols, and a run of spaces that leaves its last space to a following
// word.
func TestGPT2Words(t *testing.T) {
	for _, c := range []struct {
		text string
		want []string
	}{
		{"the cat", []string{"the", " cat"}},
		{"it's don't I'll", []string{"it", "'s", " don", "'t", " I", "'ll"}},
		{"hello!! 123abc", []string{"hello", "!!", " 123", "abc"}},
		{"a  b", []string{"a", " ", " b"}},
		{"a\n\nb", []string{"a", "\n", "\n", "b"}},
		{"a \n", []string{"a", " \n"}},
		{"x   ", []string{"x", "   "}},
		{" 'sun", []string{" '", "sun"}},
		{"Köln 東京2024", []string{"Köln", " 東京", "2024"}},
	} {
		if got := words(c.text); !slices.Equal(got, c.want) {
			t.Errorf("%q: words %q, want %q", c.text, got, c.want)
		}
	}
}

// TestBPEMergesByRank: the merges apply lowest rank first, each word on its
// own, and added tokens are cut out of the text before the words.
func TestBPEMergesByRank(t *testing.T) {
	tok, err := ParseBPETokenizer(tokenizerJSON(smallMerges, "<|endoftext|>"))
	if err != nil {
		t.Fatal(err)
	}
	id := func(s string) int32 { return tok.vocab[s] }
	// "the": t,h,e -> t,he (no merge makes "the" without the space).
	// " the": Ġ,t,h,e -> Ġt,h,e -> Ġt,he -> Ġthe. " cats": Ġc,a,t,s ->
	// Ġc,at,s -> Ġcat,s. "ing": in,g -> ing.
	text := "the the cats<|endoftext|>sing"
	want := []int32{'t', id("he"), id("Ġthe"), id("Ġcat"), 's', id("<|endoftext|>"), 's', id("ing")}
	got, _ := tok.Encode([]byte(text))
	if !slices.Equal(got, want) {
		t.Errorf("%q: ids %v, want %v", text, got, want)
	}
	if tok.Vocab() != 256+len(smallMerges)+1 {
		t.Errorf("vocab %d, want %d", tok.Vocab(), 256+len(smallMerges)+1)
	}
	back, err := tok.Decode(got)
	if err != nil || string(back) != text {
		t.Errorf("decode gives %q, %v; want %q", back, err, text)
	}
	if _, err := tok.Decode([]int32{int32(tok.Vocab())}); err == nil {
		t.Errorf("decoding an id beyond the vocabulary succeeded")
	}
}

// variedText mixes scripts, digits, contractions, symbols and runs of
// spaces, tabs and newlines.
const variedText = "Grüße aus Köln — 東京 2024年, naïve café; it's done, they'll see.\n\n" +
	"  indented\ttabs\r\n123,456.78 x² ½ ٣٤ 🙂👍🏽 <tag attr=\"v\">  \n" +
	"the cat sat in the thing   \nsinging the catalogue's song!!!\u00a0nbsp\u2003em\n"

// TestBPERoundTrip: decoding gives back the text, unicode and bytes that
// are not UTF-8 included.
func TestBPERoundTrip(t *testing.T) {
	tok, err := ParseBPETokenizer(tokenizerJSON(trainMerges(variedText, 60), "<|endoftext|>"))
	if err != nil {
		t.Fatal(err)
	}
	for _, text := range []string{variedText, "a\xffb\xc3", "<|endoftext|><|endoftext|>x", ""} {
		ids, _ := tok.Encode([]byte(text))
		back, err := tok.Decode(ids)
		if err != nil || string(back) != text {
			t.Errorf("%q: decoded %q, %v", text, back, err)
		}
	}
	ids, _ := tok.Encode([]byte(variedText))
	if len(ids) >= len(variedText)*17/20 {
		t.Errorf("%d merges left %d tokens of %d bytes; the merges did not apply", 60, len(ids), len(variedText))
	}
}

// trainMerges learns n merges from text's words as BPE training does: each
// round merges the most frequent adjacent pair (the first in order on a
// tie).
func trainMerges(text string, n int) [][2]string {
	var ws [][]string
	for _, w := range words(text) {
		var syms []string
		for _, b := range []byte(w) {
			syms = append(syms, string(byteAlphabet[b]))
		}
		ws = append(ws, syms)
	}
	var merges [][2]string
	for range n {
		counts := map[[2]string]int{}
		var best [2]string
		for _, w := range ws {
			for i := 0; i+1 < len(w); i++ {
				p := [2]string{w[i], w[i+1]}
				counts[p]++
				if c := counts[p]; c > counts[best] || c == counts[best] && p[0]+" "+p[1] < best[0]+" "+best[1] {
					best = p
				}
			}
		}
		if counts[best] < 2 {
			break
		}
		merges = append(merges, best)
		for k, w := range ws {
			var out []string
			for i := 0; i < len(w); i++ {
				if i+1 < len(w) && w[i] == best[0] && w[i+1] == best[1] {
					out, i = append(out, w[i]+w[i+1]), i+1
				} else {
					out = append(out, w[i])
				}
			}
			ws[k] = out
		}
	}
	return merges
}

// TestBPEMatchesGPT2Encoder: on varied text, the ids are those of GPT-2's
// own encoder (encoder.py: the pattern through Python's regex module, the
// byte alphabet, merges by rank), run on the same tokenizer.json.
func TestBPEMatchesGPT2Encoder(t *testing.T) {
	testenv.NeedPython(t, "regex", "python3-regex")
	python := testenv.Python
	dir := t.TempDir()
	corpus := strings.Repeat(variedText, 3) + "The quick brown fox's 42 jumps over\tthe lazy dog. Ünïcödé ✓\n"
	spec := tokenizerJSON(trainMerges(corpus, 120))
	if err := os.WriteFile(filepath.Join(dir, "tokenizer.json"), spec, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "text.txt"), []byte(corpus), 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command(python, "testdata/gpt2_encoder.py", filepath.Join(dir, "tokenizer.json"), filepath.Join(dir, "text.txt")).CombinedOutput()
	if err != nil {
		t.Fatalf("GPT-2's encoder: %v\n%s", err, out)
	}
	var want []int32
	if err := json.Unmarshal(out, &want); err != nil {
		t.Fatalf("GPT-2's encoder printed %q: %v", out, err)
	}
	tok, err := LoadBPETokenizer(filepath.Join(dir, "tokenizer.json"))
	if err != nil {
		t.Fatal(err)
	}
	got, _ := tok.Encode([]byte(corpus))
	if !slices.Equal(got, want) {
		i := 0
		for i < min(len(got), len(want)) && got[i] == want[i] {
			i++
		}
		t.Errorf("%d ids, GPT-2's encoder %d; first difference at %d: %v vs %v", len(got), len(want), i, got[i:min(len(got), i+5)], want[i:min(len(want), i+5)])
	}
}

// TestBPERefusesWhatItDoesNotImplement: other models, normalizers,
// pre-tokenizers and decoders are refused by name.
func TestBPERefusesWhatItDoesNotImplement(t *testing.T) {
	base := tokenizerJSON(smallMerges)
	edit := func(f func(m map[string]any)) []byte {
		var m map[string]any
		json.Unmarshal(base, &m)
		f(m)
		b, _ := json.Marshal(m)
		return b
	}
	for _, c := range []struct {
		spec []byte
		want string
	}{
		{edit(func(m map[string]any) { m["model"].(map[string]any)["type"] = "WordPiece" }), `model.type "WordPiece": only BPE is supported`},
		{edit(func(m map[string]any) { m["normalizer"] = map[string]any{"type": "NFC"} }), `normalizer "NFC": no normalizer is supported`},
		{edit(func(m map[string]any) { m["pre_tokenizer"] = map[string]any{"type": "Metaspace"} }), `pre_tokenizer "Metaspace": only ByteLevel`},
		{edit(func(m map[string]any) { m["decoder"] = map[string]any{"type": "WordPiece"} }), `decoder "WordPiece": only ByteLevel`},
		{edit(func(m map[string]any) { m["model"].(map[string]any)["byte_fallback"] = true }), `model.byte_fallback is not supported`},
		{edit(func(m map[string]any) { m["model"].(map[string]any)["ignore_merges"] = true }), `model.ignore_merges is not supported`},
		{edit(func(m map[string]any) { m["model"].(map[string]any)["merges"] = []string{"Ġ zz"} }), `model.merges[0]: "Ġ" "zz": a part or the merged token is not in model.vocab`},
		{edit(func(m map[string]any) { delete(m["model"].(map[string]any)["vocab"].(map[string]any), "a") }), `model.vocab: has no token for byte 0x61`},
	} {
		if _, err := ParseBPETokenizer(c.spec); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("err = %v, want one containing %q", err, c.want)
		}
	}
	pairs := edit(func(m map[string]any) {
		m["model"].(map[string]any)["merges"] = [][]string{{"Ġ", "t"}, {"h", "e"}, {"Ġt", "he"}}
	})
	tok, err := ParseBPETokenizer(pairs)
	if err != nil {
		t.Fatalf("merges written as pairs: %v", err)
	}
	if ids, _ := tok.Encode([]byte(" the")); len(ids) != 1 || ids[0] != tok.vocab["Ġthe"] {
		t.Errorf("merges written as pairs: \" the\" is %v, want [%d]", ids, tok.vocab["Ġthe"])
	}
}
