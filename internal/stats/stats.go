// Package stats holds the one definition of the summaries pipetrain reports,
// so that the profiler, the cost measurements of plan and simulate, and the
// benchmarks agree on them.
package stats

import "slices"

// Number is what Median summarises: durations, counts, measurements.
type Number interface {
	~int | ~int64 | ~float64
}

// Median is the middle of xs in sorted order, the mean of the two middle
// values for an even count, and 0 for none. xs is left as it was.
func Median[T Number](xs []T) T {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}
