package stages

import (
	"fmt"
	"testing"
)

// TestInterleavedZBEqualsReference: interleaved-zb, interleaved's chunks and
// order with each backward split into an input-gradient pass and a weight
// pass run later, trains bit for bit the model one runtime trains, for
// p = 2, 3, 4, v = 2 and 3, several m, uneven chunks, and both optimizers.
func TestInterleavedZBEqualsReference(t *testing.T) {
	cases := []struct {
		layers [][]string
		micro  []int
	}{
		{[][]string{{"0", "2"}, {"1", "3"}}, []int{2, 4}},
		{[][]string{{"0", "3"}, {"1", "4"}, {"2", "5"}}, []int{3, 6}},
		{[][]string{{"0", "4"}, {"1", "5"}, {"2", "6"}, {"3", "7"}}, []int{4}},
		{[][]string{{"0", "2", "4"}, {"1", "3", "5"}}, []int{2, 4}},
		{[][]string{{"0-1", "4"}, {"2", "5"}, {"3", "6-7"}}, []int{3}}, // uneven chunks
	}
	for _, c := range cases {
		for _, micro := range c.micro {
			for _, opt := range []string{"adam", "sgd"} {
				t.Run(fmt.Sprintf("p%d/v%d/m%d/%v/%s", len(c.layers), len(c.layers[0]), micro, c.layers, opt), func(t *testing.T) {
					cfg := testConfig("interleaved-zb", c.layers, micro, "float64", opt)
					sameMLPRun(t, cfg, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
				})
			}
		}
	}
}
