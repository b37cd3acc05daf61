// Package words writes text for people: counts ("1 stage", "4 stages") and
// peer-sent text clipped to a bound.
package words

import (
	"strconv"
	"unicode/utf8"
)

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

// Clip cuts s to at most n bytes, at the start of a UTF-8 sequence, marking
// the cut: text a peer sent, bounded before it is logged or echoed.
func Clip(s string, n int) string {
	const mark = " [cut]"
	if len(s) <= n {
		return s
	}
	end := n - len(mark)
	for end > 0 && !utf8.RuneStart(s[end]) {
		end--
	}
	return s[:end] + mark
}
