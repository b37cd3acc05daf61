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
