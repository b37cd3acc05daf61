package main

import (
	"slices"
	"strings"
	"testing"
)

// TestChooseKeepsTheBaseline: a selection measures what it names, with
// 1f1b's plain row kept for the throughput column, and refuses what it does
// not know.
func TestChooseKeepsTheBaseline(t *testing.T) {
	all := selection{recompute: true}
	if all.partial() {
		t.Error("the default selection is partial")
	}
	setups, rows, err := all.choose(allSetups, allRows)
	if err != nil || len(setups) != len(allSetups) || !slices.Equal(rows, allRows) {
		t.Fatalf("default: %d setups, rows %v, %v; want the whole sweep", len(setups), rows, err)
	}

	s := selection{setups: "pinned", schedules: "zb-v, dualpipev", micros: "4,8"}
	if !s.partial() {
		t.Error("a selection of two schedules is not partial")
	}
	setups, rows, err = s.choose(allSetups, allRows)
	if err != nil {
		t.Fatal(err)
	}
	if len(setups) != 1 || setups[0].key != "pinned" || !slices.Equal(setups[0].micros, []int{4, 8}) {
		t.Errorf("setups %+v, want pinned at m = 4, 8", setups)
	}
	if want := []row{{"1f1b", false}, {"zb-v", false}, {"dualpipev", false}}; !slices.Equal(rows, want) {
		t.Errorf("rows %v, want %v", rows, want)
	}
	if allSetups[1].micros[0] != 4 || len(allSetups[1].micros) != 3 {
		t.Errorf("choosing changed the setups' own micro-batch counts: %v", allSetups[1].micros)
	}

	s = selection{schedules: "1f1b,zb-h1", recompute: true}
	_, rows, _ = s.choose(allSetups, allRows)
	if want := []row{{"1f1b", false}, {"zb-h1", false}, {"1f1b", true}, {"zb-h1", true}}; !slices.Equal(rows, want) {
		t.Errorf("rows %v, want %v", rows, want)
	}

	for _, bad := range []struct {
		sel  selection
		want string
	}{
		{selection{schedules: "zbv"}, `-schedules: unknown "zbv"`},
		{selection{setups: "dedicated"}, `-setups: unknown "dedicated" (known: shared, pinned, pinned4)`},
		{selection{micros: "4,0"}, `-micro-batches: "0" is not a positive count`},
	} {
		if _, _, err := bad.sel.choose(allSetups, allRows); err == nil || !strings.Contains(err.Error(), bad.want) {
			t.Errorf("%+v: got %v, want %q", bad.sel, err, bad.want)
		}
	}
}
