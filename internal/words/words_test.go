package words

import (
	"testing"
	"time"
)

func TestCount(t *testing.T) {
	for _, c := range []struct {
		n    int
		noun string
		want string
	}{
		{1, "stage", "1 stage"}, {4, "stage", "4 stages"}, {0, "part", "0 parts"},
		{1, "micro-batch", "1 micro-batch"}, {8, "micro-batch", "8 micro-batches"},
	} {
		if got := Count(c.n, c.noun); got != c.want {
			t.Errorf("Count(%d, %q) = %q, want %q", c.n, c.noun, got, c.want)
		}
	}
}

// TestClip: text within the bound is kept whole; longer text is cut to the
// bound, never inside a UTF-8 sequence, and marked.
func TestClip(t *testing.T) {
	for _, tc := range []struct {
		s    string
		n    int
		want string
	}{
		{"short", 10, "short"},
		{"abcdefghijklmnop", 10, "abcd [cut]"},
		{"abcéfghijklmnop", 10, "abc [cut]"}, // é is two bytes: the cut would split it
	} {
		if got := Clip(tc.s, tc.n); got != tc.want || len(got) > tc.n {
			t.Errorf("Clip(%q, %d) = %q, want %q", tc.s, tc.n, got, tc.want)
		}
	}
}

func TestDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0: "0s", 400 * time.Millisecond: "0s", 45 * time.Second: "45s", 185 * time.Second: "3m05s",
		2*time.Hour + 7*time.Minute + 10*time.Second: "2h07m", -time.Second: "0s",
	} {
		if got := Duration(d); got != want {
			t.Errorf("Duration(%v) = %q, want %q", d, got, want)
		}
	}
}
