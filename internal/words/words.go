// Package words writes counts for people: "1 stage", "4 stages".
package words

import "strconv"

// Count is n followed by noun, in the plural unless n is 1. Plurals here are
// regular: "micro-batch" becomes "micro-batches", anything else takes an s.
func Count(n int, noun string) string {
	return strconv.Itoa(n) + " " + Plural(n, noun)
}

// Plural is noun, in the plural unless n is 1.
func Plural(n int, noun string) string {
	if n == 1 {
		return noun
	}
	if last := noun[len(noun)-1]; last == 'h' || last == 's' || last == 'x' {
		return noun + "es"
	}
	return noun + "s"
}
