// Package words writes text for people: counts ("1 stage", "4 stages"),
// durations on progress lines and peer-sent text clipped to a bound.
package words

import (
	"fmt"
	"strconv"
	"time"
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

// Duration writes d for a person reading a progress line: "45s", "3m05s",
// "2h07m"; under a second, "0s".
func Duration(d time.Duration) string {
	s := int64(d.Round(time.Second) / time.Second)
	switch {
	case s < 60:
		return fmt.Sprintf("%ds", max(s, 0))
	case s < 3600:
		return fmt.Sprintf("%dm%02ds", s/60, s%60)
	}
	return fmt.Sprintf("%dh%02dm", s/3600, s%3600/60)
}
