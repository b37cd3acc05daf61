package affinity

import (
	"reflect"
	"runtime"
	"testing"

	"golang.org/x/sys/unix"
)

func TestParse(t *testing.T) {
	cases := map[string][]int{"0": {0}, "0-3": {0, 1, 2, 3}, "0,2,4-5": {0, 2, 4, 5}}
	for in, want := range cases {
		if got, err := Parse(in); err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("Parse(%q) = %v, %v", in, got, err)
		}
	}
	for _, bad := range []string{"", "a", "3-1", "-1", "1-"} {
		if _, err := Parse(bad); err == nil {
			t.Errorf("Parse(%q) accepted", bad)
		}
	}
}

func TestPinAllThreads(t *testing.T) {
	var orig unix.CPUSet
	if err := unix.SchedGetaffinity(0, &orig); err != nil {
		t.Fatal(err)
	}
	defer func() { // restore, so other tests in the binary keep every CPU
		Pin(cpusOf(orig))
	}()
	if err := Pin([]int{0}); err != nil {
		t.Fatal(err)
	}
	// A thread started after pinning inherits the affinity.
	done := make(chan unix.CPUSet)
	go func() {
		runtime.LockOSThread()
		var s unix.CPUSet
		unix.SchedGetaffinity(0, &s)
		done <- s
	}()
	if s := <-done; s.Count() != 1 || !s.IsSet(0) {
		t.Errorf("thread affinity after Pin([0]): %d CPUs, CPU 0 set %v", s.Count(), s.IsSet(0))
	}
}

func cpusOf(s unix.CPUSet) []int {
	var out []int
	for c := 0; c < 1024; c++ {
		if s.IsSet(c) {
			out = append(out, c)
		}
	}
	return out
}
