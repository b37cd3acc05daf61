package profile

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/timeline"
)

// arEvent is an all-reduce of stage's gradients, timed in ms as ev's events.
func arEvent(stage, step int, start, end, wait int64, sent int64) Event {
	return Event{Stage: stage, Step: step, Kind: AllReduce, StartNS: start * ms, EndNS: end * ms, WaitNS: wait * ms, BytesSent: sent}
}

// reducedRun is gpipeRun with 2 replicas (each the same pipeline): in step
// 1 (step 2 as printed) each stage all-reduces its gradients, stage 0's from
// during its B0
// until 2 ms past its B1 (2 ms exposed), stage 1's while its B1 runs and for
// 1 ms after it, and the optimizer steps wait for them. late0 delays replica
// 1's stage-0 all-reduce's start by that many ms: handed over late, it ends
// with the others.
//
//	step 1, stage 0: B0 104-105 B1 105-106, AR 104-108 (wait 2), OPT 108-109
//	step 1, stage 1: B0 103-104 B1 104-105, AR 104-106 (wait 1), OPT 106-107
func reducedRun(late0 int64) (RunInfo, []Replica) {
	const mib = 1 << 20
	info, _ := gpipeRun()
	info.Replicas, info.BatchSize = 2, 64
	var reps []Replica
	for r := range 2 {
		_, events := gpipeRun()
		for s := range events {
			var out []Event
			for _, e := range events[s] {
				const base = 100
				if e.Kind == Optimizer && e.Step == 1 {
					if s == 0 {
						start := int64(4)
						if r == 1 {
							start += late0
						}
						out = append(out, arEvent(0, e.Step, base+start, base+8, 2, 3*mib))
						e.StartNS, e.EndNS = (base+8)*ms, (base+9)*ms
					} else {
						out = append(out, arEvent(1, e.Step, base+4, base+6, 1, mib))
						e.StartNS, e.EndNS = (base+6)*ms, (base+7)*ms
					}
					if r == 1 {
						out[len(out)-1].Replica = 1
					}
				}
				out = append(out, e)
			}
			events[s] = out
		}
		reps = append(reps, Replica{Events: events})
	}
	return info, reps
}

// withoutAllReduce is s with its all-reduce figures zeroed.
func withoutAllReduce(s StageReport) StageReport {
	s.AllReduce, s.AllReduceExposed, s.AllReduceBytes, s.AllReduceSteps, s.BusBandwidth = 0, 0, 0, 0, 0
	return s
}

// TestAnalyseAllReduce: an all-reduce runs beside the stage's actions, so the
// bubble, busy and idle time, waits, bytes and windows are the run's without
// it; its time, exposed part, bytes and bus bandwidth get figures of their
// own.
func TestAnalyseAllReduce(t *testing.T) {
	info, reps := reducedRun(0)
	r, err := Analyse(info, reps[0].Events, 1)
	if err != nil {
		t.Fatal(err)
	}
	plainInfo, plain := gpipeRun()
	want, err := Analyse(plainInfo, plain, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Window != want.Window || r.MeanBubble != want.MeanBubble || r.PredictedBubble != want.PredictedBubble ||
		!reflect.DeepEqual(r.Steps, want.Steps) || !reflect.DeepEqual(r.Links, want.Links) {
		t.Errorf("the all-reduce changed the pipeline's figures: window %v bubble %v sim %v steps %+v, want %v %v %v %+v",
			r.Window, r.MeanBubble, r.PredictedBubble, r.Steps, want.Window, want.MeanBubble, want.PredictedBubble, want.Steps)
	}
	for s := range r.Stages {
		// The optimizer steps moved to wait for the all-reduce; they
		// took as long.
		if got := withoutAllReduce(r.Stages[s]); !reflect.DeepEqual(got, want.Stages[s]) {
			t.Errorf("stage %d:\n got %+v\nwant %+v", s, got, want.Stages[s])
		}
	}
	const mib = 1 << 20
	for s, w := range []struct {
		ar, exposed time.Duration
		bytes       int64
	}{{4 * time.Millisecond, 2 * time.Millisecond, 3 * mib}, {2 * time.Millisecond, time.Millisecond, mib}} {
		got := r.Stages[s]
		// R = 2: each rank sends 2(R-1)/R S = S, so the bus bandwidth
		// 2(R-1)/R S / t is bytes sent per second.
		bus := float64(w.bytes) / w.ar.Seconds()
		if got.AllReduce != w.ar || got.AllReduceExposed != w.exposed || got.AllReduceBytes != w.bytes ||
			got.AllReduceSteps != 1 || !near(got.BusBandwidth, bus) {
			t.Errorf("stage %d: all-reduce %v exposed %v bytes %d steps %d bus %v, want %v %v %d 1 %v", s, got.AllReduce,
				got.AllReduceExposed, got.AllReduceBytes, got.AllReduceSteps, got.BusBandwidth, w.ar, w.exposed, w.bytes, bus)
		}
	}

	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	var plainOut strings.Builder
	if err := want.Write(&plainOut); err != nil {
		t.Fatal(err)
	}
	const table = "" +
		"stage  AR ms/step  exposed ms/step  AR MiB sent/step  bus GB/s\n" +
		"    0       4.000            2.000              3.00     0.786\n" +
		"    1       2.000            1.000              1.00     0.524\n"
	got := b.String()
	if !strings.Contains(got, table) || !strings.Contains(got, "2 micro-batches, replica 0 of 2, 1 step analysed") {
		t.Errorf("report lacks the all-reduce table or the replica:\n%s", got)
	}
	// Everything else reads as the run's without the all-reduce.
	got = strings.Replace(strings.Replace(got, table, "", 1), ", replica 0 of 2", "", 1)
	if got != plainOut.String() {
		t.Errorf("report beside the all-reduce differs:\n%s\nwant\n%s", got, plainOut.String())
	}
	if strings.Contains(plainOut.String(), "AR") || strings.Contains(plainOut.String(), "replica") {
		t.Errorf("a run without replicas reports all-reduces:\n%s", plainOut.String())
	}
}

// TestCovered: a stage's all-reduces queue on one ring, so their time is
// their union.
func TestCovered(t *testing.T) {
	for _, tc := range []struct {
		spans [][2]int64
		want  time.Duration
	}{
		{nil, 0},
		{[][2]int64{{5, 9}}, 4},
		{[][2]int64{{10, 14}, {2, 6}}, 8},
		{[][2]int64{{2, 6}, {4, 9}, {5, 7}}, 7},
		{[][2]int64{{2, 6}, {6, 8}}, 6},
	} {
		if got := covered(tc.spans); got != tc.want {
			t.Errorf("covered(%v) = %v, want %v", tc.spans, got, tc.want)
		}
	}
}

// TestAddReplicas: every replica's stages are measured from their own logs,
// and the replica whose all-reduce starts late, keeping the others waiting,
// is named.
func TestAddReplicas(t *testing.T) {
	info, reps := reducedRun(3)
	r, err := Analyse(info, reps[0].Events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := r.AddReplicas(reps); err != nil {
		t.Fatal(err)
	}
	msd := func(x float64) time.Duration { return time.Duration(x * float64(time.Millisecond)) }
	// Stage 0 is ready at 100 and ends its optimizer step at 109; stage 1
	// starts F0 at 101 after 1 ms of wait, and ends at 107.
	want := [][]ReplicaStage{
		{{Replica: 0, Stage: 0, Steps: 1, Step: msd(9), Busy: msd(4), AllReduce: msd(4), Exposed: msd(2)},
			{Replica: 0, Stage: 1, Steps: 1, Step: msd(7), Busy: msd(4), AllReduce: msd(2), Exposed: msd(1)}},
		{{Replica: 1, Stage: 0, Steps: 1, Step: msd(9), Busy: msd(4), AllReduce: msd(1), Exposed: msd(2), Late: msd(3)},
			{Replica: 1, Stage: 1, Steps: 1, Step: msd(7), Busy: msd(4), AllReduce: msd(2), Exposed: msd(1)}},
	}
	if !reflect.DeepEqual(r.Replicas, want) {
		t.Errorf("replicas:\n got %+v\nwant %+v", r.Replicas, want)
	}
	st := r.StragglerReplicas()
	if len(st) != 1 || st[0] != want[1][0] {
		t.Errorf("straggler replicas %+v, want replica 1's stage 0", st)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	const summary = "bottleneck: stage 0 (busy 4.0 ms)\n" +
		"replica  stage  step ms  busy ms  AR ms  exposed ms  late ms\n" +
		"      0      0      9.0      4.0    4.0         2.0      0.0\n" +
		"      0      1      7.0      4.0    2.0         1.0      0.0\n" +
		"      1      0      9.0      4.0    1.0         2.0      3.0\n" +
		"      1      1      7.0      4.0    2.0         1.0      0.0\n" +
		"straggler replicas (gradients handed over > 10% of a step after the earliest replica's): 1\n" +
		"  replica 1: stage 0's gradients 3.0 ms per step after the earliest replica's (33% of its 9.0 ms step); busy 4.0 ms per step, the others' median 4.0 ms\n"
	if got := b.String(); !strings.HasSuffix(got, summary) {
		t.Errorf("report:\n%s\nwant it to end with\n%s", got, summary)
	}

	// In step with one another, no replica is a straggler.
	info, reps = reducedRun(0)
	r, _ = Analyse(info, reps[0].Events, 1)
	if err := r.AddReplicas(reps); err != nil {
		t.Fatal(err)
	}
	b.Reset()
	r.Write(&b)
	if st := r.StragglerReplicas(); len(st) != 0 || !strings.Contains(b.String(), "of a step after the earliest replica's): none\n") {
		t.Errorf("stragglers %+v in\n%s", st, b.String())
	}

	if err := r.AddReplicas([]Replica{{Events: reps[0].Events[:1]}}); err == nil {
		t.Error("a replica with fewer stages than the run: no error")
	}
	r.ReplicasErr = fmt.Errorf("profile: no events for stage 1 of replica 1")
	b.Reset()
	r.Write(&b)
	if !strings.Contains(b.String(), "replicas: profile: no events for stage 1 of replica 1\n") {
		t.Errorf("the error reading the replicas is not reported:\n%s", b.String())
	}
}

// writeReplicaRun writes a run directory with every replica's logs, and
// each (stage, replica) process's clock record when clocks are given.
func writeReplicaRun(t *testing.T, info RunInfo, reps []Replica) string {
	t.Helper()
	dir := writeRun(t, info, reps[0].Events)
	for r, rep := range reps {
		for s, stage := range rep.Events {
			var lines []byte
			for _, e := range stage {
				l, _ := json.Marshal(e)
				lines = append(append(lines, l...), '\n')
			}
			if err := os.WriteFile(runlog.ReplicaEventsFile(dir, s, r), lines, 0o644); err != nil {
				t.Fatal(err)
			}
			if rep.Clocks != nil {
				b, _ := json.Marshal(rep.Clocks[s])
				if err := os.WriteFile(runlog.ReplicaClockFile(dir, s, r), b, 0o644); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
	return dir
}

// TestReadReplicas: ReadRun reads replica 0's logs, all-reduces included;
// ReadReplicas every replica's, each with its own processes' clock records,
// which align that replica's pipeline.
func TestReadReplicas(t *testing.T) {
	info, reps := reducedRun(3)
	// Replica 1's stage 1 ran on another host, whose clock is 3.7 s ahead.
	const ahead = 3_700 * ms
	for i := range reps[1].Events[1] {
		reps[1].Events[1][i].StartNS += ahead
		reps[1].Events[1][i].EndNS += ahead
	}
	reps[0].Clocks = clocksOf([]string{bootA, bootA}, []string{"a", "a"})
	reps[1].Clocks = clocksOf([]string{bootA, bootB}, []string{"a", "b"})
	dir := writeReplicaRun(t, info, reps)

	gotInfo, events, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	if gotInfo.Replicas != 2 || !reflect.DeepEqual(events, reps[0].Events) || !reflect.DeepEqual(gotInfo.Clocks, reps[0].Clocks) {
		t.Errorf("ReadRun: %+v\n%+v", gotInfo, events)
	}
	got, err := ReadReplicas(dir, gotInfo)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, reps) {
		t.Errorf("ReadReplicas:\n got %+v\nwant %+v", got, reps)
	}
	// Replica 1's clocks put its stage 1 back on its stage 0's; replica 0's
	// share one.
	info1 := gotInfo
	info1.Clocks = got[1].Clocks
	r1, err := Analyse(info1, got[1].Events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if !r1.Clock.Shifted || r1.Clock.Offsets[1] < time.Duration(ahead-ms) || r1.Clock.Offsets[1] > time.Duration(ahead+ms) || r1.Window != 6*time.Millisecond {
		t.Errorf("replica 1 on its own clocks: shifted %v offsets %v window %v, want stage 1 shifted by about %v",
			r1.Clock.Shifted, r1.Clock.Offsets, r1.Window, time.Duration(ahead))
	}
	r0, err := Analyse(gotInfo, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r0.Clock.Shifted {
		t.Errorf("replica 0 shifted: %v", r0.Clock.Offsets)
	}
	// The durations the summary compares need no clock: the same as from
	// the logs on one clock.
	if err := r0.AddReplicas(got); err != nil {
		t.Fatal(err)
	}
	if st := r0.StragglerReplicas(); len(st) != 1 || st[0].Replica != 1 || st[0].Late != 3*time.Millisecond {
		t.Errorf("straggler replicas %+v, want replica 1, 3 ms late", st)
	}

	// A run without replicas has none to read.
	if got, err := ReadReplicas(dir, RunInfo{Stages: 2}); got != nil || err != nil {
		t.Errorf("ReadReplicas without replicas: %v, %v", got, err)
	}
	// Each replica's logs are required.
	os.Remove(runlog.ReplicaEventsFile(dir, 1, 1))
	if _, err := ReadReplicas(dir, gotInfo); err == nil || !strings.Contains(err.Error(), "no events for stage 1 of replica 1") ||
		!strings.Contains(err.Error(), "stage-1.replica-1.jsonl") {
		t.Errorf("missing replica log: %v", err)
	}
}

// TestReadAllReduceEvents: the logs' all-reduces read as such, an unknown
// kind is still refused, and so is an event naming another replica.
func TestReadAllReduceEvents(t *testing.T) {
	info, reps := reducedRun(0)
	dir := writeReplicaRun(t, info, reps)
	path := runlog.ReplicaEventsFile(dir, 0, 1)
	for _, tc := range []struct{ line, want string }{
		{`{"stage":0,"step":0,"kind":"AR","replica":1,"start_ns":5,"end_ns":9,"wait_ns":2,"bytes_sent":8}`, ""},
		{`{"stage":0,"step":0,"kind":"AR","start_ns":5,"end_ns":9}`, ""}, // the replica left out
		{`{"stage":0,"step":0,"kind":"X"}`, `:1: unknown kind "X": want F, B, I, W, RF, OPT, AR or N`},
		{`{"stage":0,"step":0,"kind":"ar"}`, `:1: unknown kind "ar"`},
		{`{"stage":0,"step":0,"kind":"AR","replica":2}`, ":1: event of replica 2 in replica 1's log"},
		{`{"stage":1,"step":0,"kind":"AR","replica":1}`, ":1: event of stage 1 in stage 0's log"},
		{`{"stage":0,"step":0,"kind":"AR","start_ns":9,"end_ns":5}`, ":1: end_ns 5 before start_ns 9"},
	} {
		os.WriteFile(path, []byte(tc.line+"\n"), 0o644)
		got, err := ReadReplicas(dir, info)
		switch {
		case tc.want == "" && err != nil:
			t.Errorf("%s: %v", tc.line, err)
		case tc.want == "" && (len(got[1].Events[0]) != 1 || got[1].Events[0][0].Kind != AllReduce):
			t.Errorf("%s: read %+v", tc.line, got[1].Events[0])
		case tc.want != "" && (err == nil || !strings.Contains(err.Error(), path+tc.want)):
			t.Errorf("%s: error %v, want %q", tc.line, err, path+tc.want)
		}
	}
	// Replica 0's log refuses an event of replica 1.
	os.WriteFile(EventsFile(dir, 0), []byte(`{"stage":0,"step":0,"kind":"F","replica":1}`+"\n"), 0o644)
	if _, _, err := ReadRun(dir); err == nil || !strings.Contains(err.Error(), "event of replica 1 in replica 0's log") {
		t.Errorf("replica 1's event in replica 0's log: %v", err)
	}
}

// TestReadReplicaFiles reads the files' documented format verbatim.
func TestReadReplicaFiles(t *testing.T) {
	dir := t.TempDir()
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	os.WriteFile(filepath.Join(dir, "run.json"),
		[]byte(`{"schedule":"1f1b","stages":1,"micro_batches":4,"steps":20,"replicas":2,"batch_size":256,"theoretical_bubble":0}`), 0o644)
	os.WriteFile(filepath.Join(dir, "events", "stage-0.jsonl"),
		[]byte(`{"stage":0,"step":0,"kind":"AR","mb":0,"start_ns":1700000000000,"end_ns":1700004500000,"wait_ns":4400000,"send_ns":0,"bytes_sent":2132992,"stashed":0}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "events", "stage-0.replica-1.jsonl"),
		[]byte(`{"stage":0,"step":0,"kind":"AR","replica":1,"mb":0,"start_ns":1700001000000,"end_ns":1700004500000,"wait_ns":100000,"send_ns":0,"bytes_sent":2132992,"stashed":0}`+"\n"), 0o644)
	os.WriteFile(filepath.Join(dir, "events", "stage-0.replica-1.clock.json"), []byte(`{"host":"gpu2","boot_id":"`+bootB+`"}`), 0o644)
	info, _, err := ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	reps, err := ReadReplicas(dir, info)
	if err != nil {
		t.Fatal(err)
	}
	if info.Replicas != 2 || info.BatchSize != 256 || len(reps) != 2 || info.Clocks != nil || reps[0].Clocks != nil ||
		!reflect.DeepEqual(reps[1].Clocks, []Clock{{Host: "gpu2", BootID: bootB}}) ||
		reps[1].Events[0][0].Replica != 1 || reps[1].Events[0][0].WaitNS != 100000 {
		t.Errorf("got %+v %+v", info, reps)
	}
}

// withAllReduces adds to every stage's log, in every step, an all-reduce
// from the start of the stage's last action before its optimizer step until
// exposed ns after that action's end, and moves the optimizer step to start
// then: the all-reduce overlaps the action, and ends after every stage's
// compute of the step. exposed must be shorter than the gap between steps.
func withAllReduces(events [][]Event, sent, exposed int64) [][]Event {
	out := make([][]Event, len(events))
	for s, stage := range events {
		for i, e := range stage {
			if e.Kind == Optimizer && i > 0 {
				last := stage[i-1]
				e.StartNS, e.EndNS = e.StartNS+exposed, e.EndNS+exposed
				out[s] = append(out[s], Event{Stage: s, Step: e.Step, Kind: AllReduce, StartNS: last.StartNS, EndNS: e.StartNS,
					WaitNS: e.StartNS - last.EndNS, BytesSent: sent})
			}
			out[s] = append(out[s], e)
		}
	}
	return out
}

// TestChartAllReduce: a chart draws each all-reduce as a span of its own
// kind on its stage's row (the timeline puts it in a lane under the row),
// without a wait before it, and the rows' busy time and bubble are the run's
// without it.
func TestChartAllReduce(t *testing.T) {
	_, plain := chartRun(t, nil)
	events := withAllReduces(plain, 1000, ms/2)
	c := mustChart(t, events, 2, 2, ChartOptions{Waits: true})
	want := mustChart(t, plain, 2, 2, ChartOptions{Waits: true})
	actions := func(spans []timeline.Span) (ars, rest []timeline.Span) {
		for _, sp := range spans {
			switch sp.Kind {
			case timeline.AllReduce:
				ars = append(ars, sp)
			case timeline.Optimizer: // moved to wait for the all-reduce
			default:
				rest = append(rest, sp)
			}
		}
		return ars, rest
	}
	for s, row := range c.Rows {
		ars, rest := actions(row.Spans)
		_, wantRest := actions(want.Rows[s].Spans)
		if len(ars) != 2 || row.Note != want.Rows[s].Note || !reflect.DeepEqual(rest, wantRest) {
			t.Errorf("row %d: %d all-reduces, note %q (want %q), other spans differ: %v", s, len(ars), row.Note, want.Rows[s].Note,
				!reflect.DeepEqual(rest, wantRest))
			continue
		}
		// The all-reduce overlaps the last backward: it starts with it.
		var lastB timeline.Span
		for _, sp := range rest {
			if sp.Kind == timeline.Backward && sp.Step == ars[0].Step && sp.Start > lastB.Start {
				lastB = sp
			}
		}
		if ars[0].Start != lastB.Start || ars[0].End <= lastB.Start || !strings.Contains(ars[0].Detail, "exposed") {
			t.Errorf("row %d: all-reduce %+v, want it from the last backward's start %v", s, ars[0], lastB.Start)
		}
	}
	var svg strings.Builder
	if err := c.SVG(&svg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(svg.String(), "AR all-reduce") || strings.Count(svg.String(), `class="beside-lane"`) != 3 {
		t.Errorf("the SVG has no all-reduce lanes or legend entry")
	}
}

// TestTraceAllReduce: the trace puts each stage's all-reduces on a thread of
// their own, sorted under the stage's, where they may overlap the stage's
// slices; the stage threads hold the actions alone, as without them.
func TestTraceAllReduce(t *testing.T) {
	_, plain := chartRun(t, nil)
	events := withAllReduces(plain, 1000, ms/2)
	var b strings.Builder
	if err := WriteTrace(&b, events, 2, 2); err != nil {
		t.Fatal(err)
	}
	var tf traceFile
	if err := json.Unmarshal([]byte(b.String()), &tf); err != nil {
		t.Fatal(err)
	}
	threads, sortIndex := map[int]string{}, map[int]float64{}
	perThread := map[int]map[string]int{}
	for _, e := range tf.TraceEvents {
		switch {
		case e.Name == "thread_name":
			threads[e.Tid] = e.Args["name"].(string)
		case e.Name == "thread_sort_index":
			sortIndex[e.Tid] = e.Args["sort_index"].(float64)
		case e.Ph == "X":
			if perThread[e.Tid] == nil {
				perThread[e.Tid] = map[string]int{}
			}
			perThread[e.Tid][e.Cat]++
			if e.Cat == AllReduce {
				if e.Name != "AR" || e.Args["bytes_sent"] != 1000.0 || e.Args["exposed_us"] == nil || e.Args["step"] == nil {
					t.Errorf("all-reduce slice %s %v", e.Name, e.Args)
				}
			}
		}
	}
	for s := range 3 {
		if threads[s] != fmt.Sprintf("stage %d", s) || threads[3+s] != fmt.Sprintf("stage %d all-reduce", s) ||
			sortIndex[s] != float64(2*s) || sortIndex[3+s] != float64(2*s+1) {
			t.Errorf("stage %d: threads %q and %q, sort indices %v and %v", s, threads[s], threads[3+s], sortIndex[s], sortIndex[3+s])
		}
		if perThread[s][AllReduce] != 0 || perThread[3+s][AllReduce] != 2 || len(perThread[3+s]) != 1 || perThread[s][Forward] != 8 {
			t.Errorf("stage %d: slices %v on its thread, %v on its all-reduce thread", s, perThread[s], perThread[3+s])
		}
	}

	// Without all-reduces the threads are the stages' alone, as ever.
	b.Reset()
	if err := WriteTrace(&b, plain, 2, 2); err != nil {
		t.Fatal(err)
	}
	if strings.Contains(b.String(), "all-reduce") || !strings.Contains(b.String(), `"sort_index":2}`) {
		t.Errorf("trace without all-reduces:\n%s", b.String())
	}
}
