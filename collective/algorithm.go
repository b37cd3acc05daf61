package collective

import (
	"fmt"
	"strings"
)

// Algorithm is how a plan's all-reduce moves and folds the ranks' values
// (all_reduce.algorithm). Each folds every element in an order fixed by the
// plan alone, which Sum reproduces in one process.
type Algorithm string

const (
	// Ring is the reduce-scatter and all-gather ring (ring.go): chunk c of
	// a bucket folds ranks c, c+1, ..., c-1 (mod R).
	RingAlgorithm Algorithm = "ring"
	// ReduceToOne carries each whole bucket down the ranks in order and
	// back round (reducetoone.go): every element folds ranks 0, 1, ...,
	// R-1, left to right.
	ReduceToOne Algorithm = "reduce-to-one"
)

// Algorithms are the known algorithms, the default first.
var Algorithms = []Algorithm{RingAlgorithm, ReduceToOne, Hierarchical}

// ParseAlgorithm is the algorithm named s ("" is the default, RingAlgorithm).
func ParseAlgorithm(s string) (Algorithm, error) {
	if s == "" {
		return RingAlgorithm, nil
	}
	for _, a := range Algorithms {
		if string(a) == s {
			return a, nil
		}
	}
	names := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		names[i] = string(a)
	}
	return "", fmt.Errorf("collective: unknown all-reduce algorithm %q (known: %s)", s, strings.Join(names, ", "))
}

// WithAlgorithm is p reduced by algorithm a.
func (p Plan) WithAlgorithm(a Algorithm) (Plan, error) {
	a, err := ParseAlgorithm(string(a))
	if err != nil {
		return Plan{}, err
	}
	p.Algorithm = a
	return p, nil
}

// ring reports whether p is reduced by the ring ("" too).
func (p Plan) ring() bool { return p.Algorithm == "" || p.Algorithm == RingAlgorithm }
