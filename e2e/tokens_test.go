package e2e

import (
	endian "encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/data"
)

// writeShards writes the bytes of the Go sources of package strings as
// token files into dir: the first 90% as three llm.c shards, the rest as a
// nanoGPT file of uint16 tokens.
func writeShards(t *testing.T, dir string) {
	t.Helper()
	src, err := data.GoSourceDir("strings")
	if err != nil {
		// The Go toolchain running this test ships its standard library's
		// sources: without them the installation is broken, not lacking.
		t.Fatal(err)
	}
	corpus, err := data.LoadCorpus(src, "*.go", 1<<18)
	if err != nil {
		t.Fatal(err)
	}
	cut := len(corpus) * 9 / 10
	train, val := corpus[:cut], corpus[cut:]
	tokens := func(b []byte, out []byte) []byte {
		for _, c := range b {
			out = endian.LittleEndian.AppendUint16(out, uint16(c))
		}
		return out
	}
	for i := range 3 {
		part := train[i*len(train)/3 : (i+1)*len(train)/3]
		h := make([]byte, 1024)
		endian.LittleEndian.PutUint32(h[0:], 20240520)
		endian.LittleEndian.PutUint32(h[4:], 1)
		endian.LittleEndian.PutUint32(h[8:], uint32(len(part)))
		if err := os.WriteFile(filepath.Join(dir, "strings_train_00"+string(rune('0'+i))+".bin"), tokens(part, h), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(dir, "val.bin"), tokens(val, nil), 0o644); err != nil {
		t.Fatal(err)
	}
}

// TestTokenShardsEqualReference: a GPT trained from token files (dataset
// tokens) on a grid of 2 stages × 2 replicas, one process each, equals the
// one-process reference bit for bit, every step's loss, the evaluations and
// the final weights; each process reads the shards itself, so the first and
// last stages of every replica agree on their windows without sending
// labels. A shard cut short is refused by name before any stage starts.
func TestTokenShardsEqualReference(t *testing.T) {
	dir := t.TempDir()
	writeShards(t, dir)
	body := strings.Replace(gridGPT, `data: {dataset: text, corpus: "go:strings", glob: "*.go", tokenizer: byte,`,
		`data: {dataset: tokens, train_shards: "`+filepath.Join(dir, "strings_train_*.bin")+`", val_shards: "`+filepath.Join(dir, "val.bin")+`",`, 1)
	body = strings.Replace(body, "train: {steps: 30, evaluate: false,", "train: {steps: 12, seed: 7, evaluate: true, eval_every: 6,", 1)
	cfg := gridConfig(t, body+"\nschedule: 1f1b", []string{`"0-1"`, `"2-3"`}, 2)
	refDir, gridDir := t.TempDir(), t.TempDir()
	if r := run(t, 3*time.Minute, nil, "reference", "--pipeline-threads", "--config", cfg, "--run-dir", refDir); r.err != nil {
		t.Fatalf("reference: %v\n%s", r.err, r.out)
	}
	res := run(t, 3*time.Minute, nil, "launch", "--config", cfg, "--run-dir", gridDir)
	if res.err != nil {
		t.Fatalf("launch: %v\n%s", res.err, res.out)
	}
	got := sameRun(t, refDir, gridDir, 12)
	sameEval(t, refDir, gridDir)
	if got[5].Eval == nil || !(got[11].Loss < got[0].Loss) {
		t.Errorf("no evaluation at step 6, or the loss did not fall: %v -> %v", got[0].Loss, got[11].Loss)
	}

	// A token beyond the vocabulary inside the first window of the first
	// step, which the check before the run does not sample, stops the run
	// there, naming the file and the offset, without a restart.
	shards, _ := filepath.Glob(filepath.Join(dir, "strings_train_*.bin"))
	stream, err := data.OpenTokenStream(shards, "", "")
	if err != nil {
		t.Fatal(err)
	}
	sampler, err := data.NewTextSampler(7, int(stream.Len()), 32, 16)
	if err != nil {
		t.Fatal(err)
	}
	bad := int64(sampler.Starts(0)[0]) + 1
	f := stream.Files[0]
	for bad >= f.Tokens {
		bad -= f.Tokens
		stream.Files = stream.Files[1:]
		f = stream.Files[0]
	}
	offset := f.ByteOffset(bad)
	stream.Close()
	b, err := os.ReadFile(f.Path)
	if err != nil {
		t.Fatal(err)
	}
	good := slices.Clone(b)
	endian.LittleEndian.PutUint16(b[offset:], 300)
	if err := os.WriteFile(f.Path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	res = run(t, time.Minute, nil, "launch", "--config", cfg, "--run-dir", t.TempDir())
	want := fmt.Sprintf("%s: token id 300 at token %d (byte offset %d) is not in model.vocab's [0, 256)", f.Path, bad, offset)
	if res.err == nil || !strings.Contains(res.out, want) || !strings.Contains(res.out, "a restart would fail the same way") {
		t.Errorf("launch with token 300 in step 1's first window: %v, want %q\n%s", res.err, want, res.out)
	}

	// A shard cut short is refused before any stage starts.
	if err := os.WriteFile(f.Path, good[:len(good)-2], 0o644); err != nil {
		t.Fatal(err)
	}
	res = run(t, time.Minute, nil, "launch", "--config", cfg, "--run-dir", t.TempDir())
	if res.err == nil || !strings.Contains(res.out, f.Path+": file too short") || strings.Contains(res.out, "[stage 0") {
		t.Errorf("launch with a shard cut short: %v\n%s", res.err, res.out)
	}
}
