package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/runlog"
)

// writeProfileRun writes a run directory of gpipe on 2 stages with 2
// micro-batches for the given steps, as the stages log it (step indices from
// 0), and returns its path.
func writeProfileRun(t *testing.T, steps int) string {
	t.Helper()
	dir := t.TempDir()
	info := profile.RunInfo{Schedule: "gpipe", Stages: 2, MicroBatches: 2, Steps: steps, TheoreticalBubble: 1.0 / 3}
	b, _ := json.Marshal(info)
	if err := os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Mkdir(filepath.Join(dir, "events"), 0o755); err != nil {
		t.Fatal(err)
	}
	// Times in tenths of a millisecond from the step's start.
	type action struct {
		kind       string
		mb         int
		start, end int64
	}
	plan := [][]action{
		{{"F", 0, 0, 10}, {"F", 1, 10, 20}, {"B", 0, 50, 60}, {"B", 1, 60, 70}, {"OPT", 0, 70, 80}},
		{{"F", 0, 11, 21}, {"F", 1, 22, 32}, {"B", 0, 33, 43}, {"B", 1, 44, 54}, {"OPT", 0, 55, 65}},
	}
	const wall0, tenth = int64(1_700_000_000_000_000_000), int64(100_000)
	for s, actions := range plan {
		var lines []byte
		for step := range steps {
			base := wall0 + int64(step)*1000*tenth
			for _, a := range actions {
				e := profile.Event{Stage: s, Step: step, Kind: a.kind, MB: a.mb, StartNS: base + a.start*tenth, EndNS: base + a.end*tenth}
				l, _ := json.Marshal(e)
				lines = append(append(lines, l...), '\n')
			}
		}
		if err := os.WriteFile(profile.EventsFile(dir, s), lines, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestProfileRangesOutsideRun: a step range outside the run is refused with an
// error naming the flag and the steps the run logged, before anything is
// printed or written.
func TestProfileRangesOutsideRun(t *testing.T) {
	run := writeProfileRun(t, 5)
	svg := filepath.Join(t.TempDir(), "run.svg")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--first-step", "100", "--svg", svg}, "--first-step 100 is outside the run: the run logged 5 steps, 1 to 5"},
		{[]string{"--first-step", "0", "--svg", svg}, "--first-step 0 is outside the run: the run logged 5 steps, 1 to 5"},
		{[]string{"--skip", "100"}, "--skip 100 leaves no step to analyse: the run logged 5 steps, 1 to 5 (--skip 0 to 4)"},
		{[]string{"--skip", "5"}, "--skip 5 leaves no step to analyse"},
		{[]string{"--skip", "-1"}, "--skip -1 leaves no step to analyse"},
		{[]string{"--chart-steps", "0", "--svg", svg}, "--chart-steps 0: show at least 1 step"},
	} {
		out, err := runCommand(t, profileCmd(), append([]string{run}, tc.args...)...)
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: error %v, want %q", tc.args, err, tc.want)
		}
		if strings.Contains(out, "bubble") {
			t.Errorf("%v: printed a report:\n%s", tc.args, out)
		}
		if _, err := os.Stat(svg); !os.IsNotExist(err) {
			t.Errorf("%v: wrote %s (%v)", tc.args, svg, err)
		}
	}

	// The default warm-up on a run of one step analyses that step.
	out, err := runCommand(t, profileCmd(), writeProfileRun(t, 1))
	if err != nil || !strings.Contains(out, "1 step analysed (step 1)") {
		t.Errorf("one-step run: %v\n%s", err, out)
	}
}

// TestProfileStepNumbers: the text report, the files' message, the SVG's title
// and the trace all number steps as the training log does (from 1), and the
// pictures start after the warm-up --skip leaves out.
func TestProfileStepNumbers(t *testing.T) {
	run := writeProfileRun(t, 5)
	dir := t.TempDir()
	svg, trace := filepath.Join(dir, "run.svg"), filepath.Join(dir, "run.json")
	for _, tc := range []struct {
		args     []string
		from, to int
		wrote    string
	}{
		{nil, 2, 4, "(steps 2 to 4)"},
		{[]string{"--skip", "2"}, 3, 5, "(steps 3 to 5)"},
		{[]string{"--first-step", "4"}, 4, 5, "(steps 4 to 5)"},
		{[]string{"--first-step", "1", "--chart-steps", "1"}, 1, 1, "(step 1)"},
	} {
		out, err := runCommand(t, profileCmd(), append([]string{run, "--steps", "--svg", svg, "--trace", trace}, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		for _, want := range []string{"wrote " + svg + " " + tc.wrote, "wrote " + trace + " " + tc.wrote} {
			if !strings.Contains(out, want) {
				t.Errorf("%v: output lacks %q:\n%s", tc.args, want, out)
			}
		}
		b, err := os.ReadFile(svg)
		if err != nil {
			t.Fatal(err)
		}
		title := "measured run, steps " + strconv.Itoa(tc.from) + "-" + strconv.Itoa(tc.to)
		if tc.from == tc.to {
			title = "measured run, step " + strconv.Itoa(tc.from)
		}
		if !strings.Contains(string(b), title) {
			t.Errorf("%v: SVG lacks %q", tc.args, title)
		}
		var tf struct {
			TraceEvents []struct {
				Ph   string         `json:"ph"`
				Args map[string]any `json:"args"`
			} `json:"traceEvents"`
			OtherData map[string]any `json:"otherData"`
		}
		if b, err = os.ReadFile(trace); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(b, &tf); err != nil {
			t.Fatal(err)
		}
		if tf.OtherData["first_step"] != float64(tc.from) || tf.OtherData["last_step"] != float64(tc.to) {
			t.Errorf("%v: trace's otherData %v, want steps %d to %d", tc.args, tf.OtherData, tc.from, tc.to)
		}
		seen := map[float64]bool{}
		for _, e := range tf.TraceEvents {
			if e.Ph == "X" {
				seen[e.Args["step"].(float64)] = true
			}
		}
		if len(seen) != tc.to-tc.from+1 || !seen[float64(tc.from)] || !seen[float64(tc.to)] {
			t.Errorf("%v: trace holds steps %v, want %d to %d", tc.args, seen, tc.from, tc.to)
		}
	}
	// The per-step table of the default run: steps 2 to 5.
	out, _ := runCommand(t, profileCmd(), run, "--steps")
	if !strings.Contains(out, "4 steps analysed (2-5)") || !strings.Contains(out, "\n   5 ") || strings.Contains(out, "\n   1 ") {
		t.Errorf("report's steps:\n%s", out)
	}
}

// TestProfileSharedClockPictures: two stages that recorded one boot id are
// never shifted apart, in the report or in the pictures, though their
// activations seem to arrive 2 ms before they were sent; without the records
// the same logs are shifted everywhere.
func TestProfileSharedClockPictures(t *testing.T) {
	dir := t.TempDir()
	info := profile.RunInfo{Schedule: "gpipe", Stages: 2, MicroBatches: 2, Steps: 3, TheoreticalBubble: 1.0 / 3}
	b, _ := json.Marshal(info)
	os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	// Tenths of a millisecond from the step's start: activations 2 ms early,
	// gradients 0.1 ms late.
	type action struct {
		kind       string
		mb         int
		start, end int64
	}
	plan := [][]action{
		{{"F", 0, 30, 40}, {"F", 1, 40, 50}, {"B", 0, 51, 61}, {"B", 1, 61, 71}, {"OPT", 0, 71, 81}},
		{{"F", 0, 20, 30}, {"F", 1, 30, 40}, {"B", 0, 40, 50}, {"B", 1, 50, 60}, {"OPT", 0, 60, 70}},
	}
	const wall0, tenth = int64(1_700_000_000_000_000_000), int64(100_000)
	for s, actions := range plan {
		var lines []byte
		for step := range 3 {
			for _, a := range actions {
				base := wall0 + int64(step)*1000*tenth
				l, _ := json.Marshal(profile.Event{Stage: s, Step: step, Kind: a.kind, MB: a.mb, StartNS: base + a.start*tenth, EndNS: base + a.end*tenth})
				lines = append(append(lines, l...), '\n')
			}
		}
		os.WriteFile(profile.EventsFile(dir, s), lines, 0o644)
	}
	pics := t.TempDir()
	svg, trace := filepath.Join(pics, "run.svg"), filepath.Join(pics, "run.json")
	check := func(shifted bool, clockLine string) {
		t.Helper()
		out, err := runCommand(t, profileCmd(), dir, "--svg", svg, "--trace", trace)
		if err != nil || !strings.Contains(out, clockLine) {
			t.Errorf("report lacks %q (%v):\n%s", clockLine, err, out)
		}
		s, _ := os.ReadFile(svg)
		if got := strings.Contains(string(s), "clocks aligned to stage 0"); got != shifted {
			t.Errorf("SVG's title says the clocks were shifted: %v, want %v", got, shifted)
		}
		var tf struct {
			OtherData map[string]any `json:"otherData"`
		}
		tb, _ := os.ReadFile(trace)
		if err := json.Unmarshal(tb, &tf); err != nil || tf.OtherData["clocks_shifted"] != shifted {
			t.Errorf("trace's otherData %v (%v), want clocks_shifted %v", tf.OtherData, err, shifted)
		}
	}
	check(true, "clocks: shifted to stage 0's (largest offset 1.050 ms")
	for s, host := range []string{"box-a", "box-b"} { // two containers on one kernel
		os.WriteFile(profile.ClockFile(dir, s), []byte(`{"host":"`+host+`","boot_id":"1a2b3c4d-5e6f-4a8b-9c0d-1e2f3a4b5c6d"}`), 0o644)
	}
	check(false, "clocks: not shifted: stages 0-1 share one clock (boot id 1a2b3c4d…, hosts box-a, box-b)\n")
}

// writeReplicaProfileRun writes a run directory of gpipe on 2 stages with 2
// micro-batches and 2 data-parallel replicas for 5 steps: each stage
// all-reduces its gradients from its last backward's start until its
// optimizer step, and replica 1 hands stage 0's over 1 ms late.
func writeReplicaProfileRun(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	const steps = 5
	info := profile.RunInfo{Schedule: "gpipe", Stages: 2, MicroBatches: 2, Steps: steps, Replicas: 2, BatchSize: 64,
		TheoreticalBubble: 1.0 / 3}
	b, _ := json.Marshal(info)
	os.WriteFile(filepath.Join(dir, "run.json"), b, 0o644)
	os.Mkdir(filepath.Join(dir, "events"), 0o755)
	// Tenths of a millisecond from the step's start.
	type action struct {
		kind             string
		mb               int
		start, end, wait int64
	}
	plan := [][]action{
		{{"F", 0, 0, 10, 0}, {"F", 1, 10, 20, 0}, {"B", 0, 50, 60, 30}, {"B", 1, 60, 70, 0}, {"AR", 0, 60, 75, 5}, {"OPT", 0, 75, 85, 0}},
		{{"F", 0, 11, 21, 11}, {"F", 1, 22, 32, 1}, {"B", 0, 33, 43, 1}, {"B", 1, 44, 54, 1}, {"AR", 0, 44, 60, 6}, {"OPT", 0, 60, 70, 0}},
	}
	const wall0, tenth = int64(1_700_000_000_000_000_000), int64(100_000)
	for r := range 2 {
		for s, actions := range plan {
			var lines []byte
			for step := range steps {
				base := wall0 + int64(step)*1000*tenth
				for _, a := range actions {
					e := profile.Event{Stage: s, Step: step, Kind: a.kind, MB: a.mb, StartNS: base + a.start*tenth, EndNS: base + a.end*tenth,
						WaitNS: a.wait * tenth}
					if a.kind == "AR" {
						e.Replica, e.BytesSent = r, 1<<20
						if r == 1 && s == 0 {
							e.StartNS += 10 * tenth
						}
					}
					l, _ := json.Marshal(e)
					lines = append(append(lines, l...), '\n')
				}
			}
			if err := os.WriteFile(runlog.ReplicaEventsFile(dir, s, r), lines, 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	return dir
}

// TestProfileReplicas: a run with replicas reports replica 0's pipeline with
// each stage's all-reduce, then every replica's stages and the straggler;
// --replica shows another replica's; the trace has the all-reduces on
// threads of their own. A run without replicas reports none of it.
func TestProfileReplicas(t *testing.T) {
	run := writeReplicaProfileRun(t)
	trace := filepath.Join(t.TempDir(), "run.json")
	out, err := runCommand(t, profileCmd(), run, "--trace", trace)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{
		"stage  AR ms/step  exposed ms/step  AR MiB sent/step  bus GB/s\n" +
			"    0       1.500            0.500              1.00     0.699\n" +
			"    1       1.600            0.600              1.00     0.655\n",
		"(schedule gpipe, 2 stages, 2 micro-batches, replica 0 of 2, 4 steps analysed (2-5), window 28.0 ms)",
		"replica  stage  step ms  busy ms  AR ms  exposed ms  late ms\n" +
			"      0      0      8.5      4.0    1.5         0.5      0.0\n" +
			"      0      1      7.0      4.0    1.6         0.6      0.0\n" +
			"      1      0      8.5      4.0    0.5         0.5      1.0\n" +
			"      1      1      7.0      4.0    1.6         0.6      0.0\n",
		"straggler replicas (gradients handed over > 10% of a step after the earliest replica's): 1\n" +
			"  replica 1: stage 0's gradients 1.0 ms per step after the earliest replica's (12% of its 8.5 ms step)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("report lacks\n%s\nin\n%s", want, out)
		}
	}
	tb, _ := os.ReadFile(trace)
	if !strings.Contains(string(tb), `"name":"stage 1 all-reduce"`) || !strings.Contains(string(tb), `"name":"AR","cat":"AR"`) {
		t.Errorf("trace lacks the all-reduce threads:\n%s", tb)
	}

	out, err = runCommand(t, profileCmd(), run, "--replica", "1")
	if err != nil || !strings.Contains(out, "replica 1 of 2") || !strings.Contains(out, "    0       0.500            0.500") {
		t.Errorf("--replica 1: %v\n%s", err, out)
	}
	if _, err := runCommand(t, profileCmd(), run, "--replica", "2"); err == nil || !strings.Contains(err.Error(), "--replica 2: the run has 2 replicas, 0 to 1") {
		t.Errorf("--replica 2: %v", err)
	}

	// Without one replica's log the report is replica 0's, and says why it
	// has no replica summary.
	os.Remove(runlog.ReplicaEventsFile(run, 1, 1))
	out, err = runCommand(t, profileCmd(), run)
	if err != nil || !strings.Contains(out, "AR ms/step") || !strings.Contains(out, "replicas: profile: no events for stage 1 of replica 1") ||
		strings.Contains(out, "late ms") {
		t.Errorf("without replica 1's stage 1: %v\n%s", err, out)
	}
	if _, err := runCommand(t, profileCmd(), run, "--replica", "1"); err == nil || !strings.Contains(err.Error(), "stage-1.replica-1.jsonl") {
		t.Errorf("--replica 1 without its log: %v", err)
	}

	plain := writeProfileRun(t, 5)
	out, err = runCommand(t, profileCmd(), plain)
	if err != nil || strings.Contains(out, "AR") || strings.Contains(out, "replica") {
		t.Errorf("run without replicas: %v\n%s", err, out)
	}
	if _, err := runCommand(t, profileCmd(), plain, "--replica", "1"); err == nil || !strings.Contains(err.Error(), "the run has no replicas") {
		t.Errorf("--replica 1 without replicas: %v", err)
	}
}
