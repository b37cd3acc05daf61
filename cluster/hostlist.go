package cluster

import (
	"fmt"
	"strconv"
	"strings"
)

// maxHosts bounds an expansion, so a typo such as node[1-99999999] fails
// instead of filling memory.
const maxHosts = 1 << 16

// ExpandHostlist expands a Slurm host list, as `scontrol show hostnames`
// does: "node[10,20-21],gpu01" is node10, node20, node21, gpu01. Ranges keep
// their zero padding (n[08-10] is n08, n09, n10), and a name may hold
// several bracket groups (r[1-2]n[1-2]), expanded left to right.
func ExpandHostlist(list string) ([]string, error) {
	var out []string
	for _, name := range splitTop(list) {
		if name == "" {
			continue
		}
		hosts, err := expandName(name)
		if err != nil {
			return nil, fmt.Errorf("host list %q: %w", list, err)
		}
		out = append(out, hosts...)
		if len(out) > maxHosts {
			return nil, fmt.Errorf("host list %q: more than %d hosts", list, maxHosts)
		}
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("host list %q names no host", list)
	}
	return out, nil
}

// splitTop splits at the commas outside brackets.
func splitTop(s string) []string {
	var parts []string
	depth, start := 0, 0
	for i, c := range s {
		switch c {
		case '[':
			depth++
		case ']':
			depth--
		case ',':
			if depth == 0 {
				parts = append(parts, s[start:i])
				start = i + 1
			}
		}
	}
	return append(parts, s[start:])
}

// expandName expands the first bracket group of name, then the rest.
func expandName(name string) ([]string, error) {
	open := strings.IndexByte(name, '[')
	if open < 0 {
		if strings.ContainsRune(name, ']') {
			return nil, fmt.Errorf("%q: ']' without '['", name)
		}
		return []string{name}, nil
	}
	end := strings.IndexByte(name[open:], ']')
	if end < 0 {
		return nil, fmt.Errorf("%q: '[' without ']'", name)
	}
	end += open
	prefix, body, rest := name[:open], name[open+1:end], name[end+1:]
	tails, err := expandName(rest)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, item := range strings.Split(body, ",") {
		lo, hi, found := strings.Cut(item, "-")
		if !found {
			hi = lo
		}
		a, err1 := strconv.Atoi(lo)
		b, err2 := strconv.Atoi(hi)
		if err1 != nil || err2 != nil || a < 0 || b < a {
			return nil, fmt.Errorf("%q: %q is not a number or a range a-b with a <= b", name, item)
		}
		if b-a > maxHosts {
			return nil, fmt.Errorf("%q: range %q has more than %d hosts", name, item, maxHosts)
		}
		width := 0
		if len(lo) > 1 && lo[0] == '0' {
			width = len(lo)
		}
		for n := a; n <= b; n++ {
			num := fmt.Sprintf("%0*d", width, n)
			for _, t := range tails {
				out = append(out, prefix+num+t)
			}
			if len(out) > maxHosts {
				return nil, fmt.Errorf("more than %d hosts", maxHosts)
			}
		}
	}
	return out, nil
}
