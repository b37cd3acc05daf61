package ps

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
)

type push struct {
	w    int
	step int64
}

// feed pushes ps in order and describes what came out: "u<step>:<workers>"
// per update, "d<worker>" per drop.
func feed(t *testing.T, m *Machine, ps ...push) []string {
	t.Helper()
	var out []string
	for _, p := range ps {
		up, dropped, err := m.Push(p.w, p.step)
		if err != nil {
			t.Fatalf("push %v: %v", p, err)
		}
		if dropped {
			out = append(out, fmt.Sprintf("d%d", p.w))
		}
		if up != nil {
			out = append(out, fmt.Sprintf("u%d:%v", up.Step, up.Workers))
			if m.rule.Async {
				out[len(out)-1] += fmt.Sprint(up.Staleness)
			}
		}
	}
	return out
}

// TestSyncSumsEveryWorkerInWorkerOrder: with every worker aggregated, the
// update waits for the last push and lists the workers in worker order,
// whatever order they arrived in; pulls of the next step wait for it.
func TestSyncSumsEveryWorkerInWorkerOrder(t *testing.T) {
	m, err := NewMachine(Rule{Workers: 3}, 0)
	if err != nil {
		t.Fatal(err)
	}
	if got := feed(t, m, push{2, 0}, push{0, 0}); len(got) != 0 || m.Pullable(0, 1) {
		t.Fatalf("after 2 of 3 pushes: %v, pullable %v", got, m.Pullable(0, 1))
	}
	if got := feed(t, m, push{1, 0}); !slices.Equal(got, []string{"u0:[0 1 2]"}) {
		t.Fatalf("got %v", got)
	}
	if !m.Pullable(0, 1) || m.Pullable(0, 2) || m.Version() != 1 {
		t.Fatalf("version %d", m.Version())
	}
	if got := feed(t, m, push{1, 1}, push{2, 1}, push{0, 1}); !slices.Equal(got, []string{"u1:[0 1 2]"}) {
		t.Fatalf("step 2: %v", got)
	}
}

// TestBackupWorkersDropExactlyTheLatePushes: with 2 of 3 aggregated, each
// update sums the first two pushes of its step, in worker order, and the
// third push of the step is dropped and counted against its worker.
func TestBackupWorkersDropExactlyTheLatePushes(t *testing.T) {
	m, err := NewMachine(Rule{Workers: 3, Aggregate: 2}, 0)
	if err != nil {
		t.Fatal(err)
	}
	got := feed(t, m,
		push{2, 0}, push{0, 0}, // update 0: workers 0 and 2
		push{1, 0},             // late: dropped
		push{1, 1}, push{0, 1}, // update 1: workers 0 and 1
		push{2, 1},             // late
		push{2, 2}, push{1, 2}, // update 2: 1 and 2
		push{0, 2})
	want := []string{"u0:[0 2]", "d1", "u1:[0 1]", "d2", "u2:[1 2]", "d0"}
	if !slices.Equal(got, want) {
		t.Fatalf("got %v\nwant %v", got, want)
	}
	for w, n := range []int64{1, 1, 1} {
		if m.Dropped(w) != n {
			t.Errorf("worker %d: %d dropped, want %d", w, m.Dropped(w), n)
		}
	}
}

// TestMachineRefusesPushesOutOfTurn: a worker cannot push a step whose
// weights it cannot have pulled, push a step twice, or be no worker.
func TestMachineRefusesPushesOutOfTurn(t *testing.T) {
	m, _ := NewMachine(Rule{Workers: 2}, 0)
	for _, c := range []struct {
		p    push
		want string
	}{
		{push{0, 1}, "worker 0 pushed step 2 before update 1 was made"},
		{push{2, 0}, "push from worker 2; the workers are 0-1"},
	} {
		if _, _, err := m.Push(c.p.w, c.p.step); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("push %v: %v, want %q", c.p, err, c.want)
		}
	}
	if _, _, err := m.Push(1, 0); err != nil {
		t.Fatal(err)
	}
	if _, _, err := m.Push(1, 0); err == nil || !strings.Contains(err.Error(), "worker 1 pushed step 1 twice") {
		t.Errorf("second push: %v", err)
	}
	if _, err := NewMachine(Rule{Workers: 2, Aggregate: 3}, 0); err == nil {
		t.Error("3 of 2 workers accepted")
	}
}

// TestAssignBalancesBytes: largest first to the lightest server, the
// same list giving the same assignment.
func TestAssignBalancesBytes(t *testing.T) {
	ts := []Tensor{{"a", 10}, {"b", 40}, {"c", 30}, {"d", 20}, {"e", 5}}
	got := Assign(ts, 2)
	// b→0 (40), c→1 (30), d→1 (50), a→0 (50), e→0 (55).
	if want := []int{0, 0, 1, 1, 0}; !slices.Equal(got, want) {
		t.Errorf("Assign = %v, want %v", got, want)
	}
	if got := Assign(ts, 1); !slices.Equal(got, []int{0, 0, 0, 0, 0}) {
		t.Errorf("one server: %v", got)
	}
}

// pull has worker w pull, which it may only once its push is applied.
func pull(t *testing.T, m *Machine, w int) {
	t.Helper()
	if !m.Pullable(w, 0) {
		t.Fatalf("worker %d may not pull at version %d", w, m.Version())
	}
	m.Pulled(w)
}

// TestAsyncZeroStalenessIsSync: with max_staleness 0 no push is applied
// before every worker's push of the step is in, and then all in one
// update, in worker order: sync's updates.
func TestAsyncZeroStalenessIsSync(t *testing.T) {
	m, err := NewMachine(Rule{Workers: 3, Async: true}, 0)
	if err != nil {
		t.Fatal(err)
	}
	for step := range int64(3) {
		if got := feed(t, m, push{2, step}, push{0, step}); len(got) != 0 {
			t.Fatalf("step %d: %v before worker 1 pushed", step+1, got)
		}
		if m.Pullable(0, 0) {
			t.Fatal("worker 0 may pull before its push is applied")
		}
		if got := feed(t, m, push{1, step}); !slices.Equal(got, []string{fmt.Sprintf("u%d:[0 1 2][0 0 0]", step)}) {
			t.Fatalf("step %d: %v", step+1, got)
		}
		for w := range 3 {
			pull(t, m, w)
		}
	}
}

// TestAsyncStalenessBound: with max_staleness 1 every push is applied on
// arrival, and a worker about to compute step s pulls once every other
// worker still in the run has pushed its steps before s-1; one that leaves
// holds nobody back.
func TestAsyncStalenessBound(t *testing.T) {
	m, _ := NewMachine(Rule{Workers: 3, Async: true, MaxStaleness: 1}, 0)
	if got := feed(t, m, push{0, 0}, push{2, 0}); !slices.Equal(got, []string{"u0:[0][0]", "u0:[2][1]"}) {
		t.Fatalf("first pushes: %v", got)
	}
	// Worker 0 may compute step 2 (index 1) while worker 1 has pushed
	// nothing: its weights miss at most one step of worker 1's.
	pull(t, m, 0)
	if got := feed(t, m, push{0, 1}); !slices.Equal(got, []string{"u1:[0][0]"}) {
		t.Fatalf("worker 0's second push: %v", got)
	}
	// Step 3 (index 2) needs every worker's step 1.
	if m.Pullable(0, 2) {
		t.Fatal("worker 0 may compute step 3 before worker 1 pushed step 1")
	}
	if got := feed(t, m, push{1, 0}); !slices.Equal(got, []string{"u0:[1][3]"}) {
		t.Fatalf("worker 1's push: %v", got)
	}
	if !m.Pullable(0, 2) || m.Pullable(0, 3) {
		t.Fatalf("after worker 1's step 1: pullable step 3 %v, step 4 %v", m.Pullable(0, 2), m.Pullable(0, 3))
	}
	m.Leave(1)
	m.Leave(2)
	if !m.Pullable(0, 3) {
		t.Error("workers 1 and 2 left, and still hold worker 0 back")
	}
}

// TestAsyncRejoin: a worker that left comes back at the step it is given:
// it counts as having pushed the steps before it, so the others wait for
// its steps from there on only; its first push's staleness counts from
// the version it rejoined at. A worker still in the run, a sync run and a
// run every worker has left refuse it.
func TestAsyncRejoin(t *testing.T) {
	m, _ := NewMachine(Rule{Workers: 3, Async: true, MaxStaleness: 1}, 0)
	if err := m.Rejoin(2, 0); err == nil || !strings.Contains(err.Error(), "worker 2 is still in the run") {
		t.Errorf("rejoin of a worker in the run: %v", err)
	}
	feed(t, m, push{0, 0}, push{1, 0}, push{2, 0})
	m.Leave(2) // lost after its first push
	for step := range int64(4) {
		for w := range 2 {
			pull(t, m, w)
		}
		feed(t, m, push{0, step + 1}, push{1, step + 1})
	}
	// Workers 0 and 1 have pushed steps 1-5 (indexes 0-4): 11 updates.
	if err := m.Rejoin(2, 5); err != nil {
		t.Fatal(err)
	}
	if !m.Pullable(2, 5) {
		t.Fatal("worker 2 may not pull at the step it rejoined at")
	}
	m.Pulled(2) // the weights of update 11
	feed(t, m, push{0, 5}, push{1, 5})
	if m.Pullable(0, 7) {
		t.Fatal("worker 0 may compute step 8 before the rejoined worker 2 pushed step 6")
	}
	if got := feed(t, m, push{2, 5}); !slices.Equal(got, []string{"u5:[2][2]"}) {
		t.Fatalf("rejoined worker 2's first push: %v", got)
	}
	if !m.Pullable(0, 7) {
		t.Error("worker 2's step 6 is in, and still holds worker 0 back")
	}

	for w := range 3 {
		m.Leave(w)
	}
	if err := m.Rejoin(2, 6); !errors.Is(err, ErrOver) {
		t.Errorf("rejoin after every worker left: %v, want ErrOver", err)
	}
	syncRun, _ := NewMachine(Rule{Workers: 2}, 0)
	syncRun.Leave(1)
	if err := syncRun.Rejoin(1, 0); err == nil || !strings.Contains(err.Error(), "sync") {
		t.Errorf("rejoin of a sync run: %v", err)
	}
	lockstep, _ := NewMachine(Rule{Workers: 2, Async: true}, 0)
	lockstep.Leave(1)
	if err := lockstep.Rejoin(1, 0); err == nil || !strings.Contains(err.Error(), "max_staleness 0") {
		t.Errorf("rejoin of an async run with max_staleness 0: %v", err)
	}
}
