package words

import "testing"

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
