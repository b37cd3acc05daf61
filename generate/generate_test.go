package generate

import (
	"math/rand/v2"
	"testing"

	"github.com/pipetrain/pipetrain/data"
)

// TestPick: temperature 0 takes the most likely token; above it, a seeded
// draw repeats and follows the distribution.
func TestPick(t *testing.T) {
	logits := []float64{0.1, 2.5, -1, 2.4}
	if got := pick(logits, 0, rand.New(rand.NewPCG(1, 1))); got != 1 {
		t.Errorf("temperature 0 picked %d, want 1", got)
	}
	draw := func(seed uint64) []int {
		rng := rand.New(rand.NewPCG(seed, 2))
		var out []int
		for range 200 {
			out = append(out, pick(logits, 1, rng))
		}
		return out
	}
	a, b := draw(7), draw(7)
	counts := map[int]int{}
	for i := range a {
		if a[i] != b[i] {
			t.Fatalf("the same seed drew %d and %d at %d", a[i], b[i], i)
		}
		counts[a[i]]++
	}
	if counts[1]+counts[3] < 150 || counts[2] > 10 {
		t.Errorf("draws %v do not follow the logits %v", counts, logits)
	}
}

// TestPromptRefusedByCharacter: a prompt character the corpus lacks is
// named as the character at its position, not as its first UTF-8 byte.
func TestPromptRefusedByCharacter(t *testing.T) {
	tok, err := data.NewCharTokenizer([]byte("func Index(s string) int"))
	if err != nil {
		t.Fatal(err)
	}
	g := &Generator{tok: tok}
	_, err = g.Generate([]byte("func é"), 5, 0, 1)
	want := "prompt: data: character 'é' at position 5 is not in the character vocabulary"
	if err == nil || err.Error() != want {
		t.Errorf("err = %v\nwant %s", err, want)
	}
}
