package stages

import (
	"fmt"
	"strings"
	"testing"

	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
)

// TestRecomputeEqualsReference: stages that recompute their forwards (full)
// or attention's probabilities (selective) train bit for bit the model the
// one-process reference trains, under fused, split, interleaved and V
// schedules; the full ones log an RF for every micro-batch and chunk, right
// before its backward, and the others none.
func TestRecomputeEqualsReference(t *testing.T) {
	mlp := []struct {
		sched  string
		layers [][]string
		micro  int
		modes  []string
	}{
		{"1f1b", plain("0", "1-2", "3"), 4, []string{"full", "", "full"}},
		{"gpipe", plain("0-1", "2-3"), 3, []string{"none", "full"}},
		{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 4, []string{"full", "full"}},
		{"zb-h1", plain("0", "1-2", "3"), 4, []string{"full", "full", ""}},
		{"zb-v", [][]string{{"0", "3"}, {"1", "2"}}, 4, []string{"", "full"}},
		{"interleaved-zb", [][]string{{"0", "2"}, {"1", "3"}}, 4, []string{"full", ""}},
		{"dualpipev", [][]string{{"0", "3"}, {"1", "2"}}, 4, []string{"full", ""}},
	}
	for _, tc := range mlp {
		for _, opt := range []string{"adam", "sgd"} {
			t.Run(fmt.Sprintf("mlp/%s/%v/%s", tc.sched, tc.modes, opt), func(t *testing.T) {
				cfg := testConfig(tc.sched, tc.layers, tc.micro, "float64", opt)
				for i, m := range tc.modes {
					cfg.Stages[i].Recompute = m
				}
				ref := runInProcess(t, cfg, true)
				pipe := runInProcess(t, cfg, false)
				sameMLPRun(t, cfg, ref, pipe)
				checkRecomputeEvents(t, pipe, tc.modes, tc.micro*len(tc.layers[0]))
			})
		}
	}
	gpt := []struct {
		sched  string
		layers [][]string
		modes  []string
	}{
		{"1f1b", plain("0-1", "2-4"), []string{"selective", "full"}},
		{"zb-h1", plain("0-1", "2-4"), []string{"full", "selective"}},
		{"zb-v", [][]string{{"0", "4"}, {"1", "2-3"}}, []string{"full", "selective"}},
		{"dualpipev", [][]string{{"0", "4"}, {"1", "2-3"}}, []string{"full", "selective"}},
	}
	for _, tc := range gpt {
		t.Run(fmt.Sprintf("gpt/%s/%v", tc.sched, tc.modes), func(t *testing.T) {
			cfg := gptConfig(tc.sched, tc.layers, true)
			for i, m := range tc.modes {
				cfg.Stages[i].Recompute = m
			}
			ref := runInProcess(t, cfg, true)
			pipe := runInProcess(t, cfg, false)
			sameRun(t, ref, pipe)
			checkRecomputeEvents(t, pipe, tc.modes, cfg.Data.MicroBatches*len(tc.layers[0]))
		})
	}
}

// checkRecomputeEvents: every step of a full stage recomputes each of its
// units (micro-batch, chunk) once, right before the unit's B or I, and no
// other stage recomputes anything.
func checkRecomputeEvents(t *testing.T, dir string, modes []string, units int) {
	t.Helper()
	_, events, err := profile.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	for st, evs := range events {
		perStep := map[int]int{}
		for i, e := range evs {
			if e.Kind != runlog.Recompute {
				continue
			}
			perStep[e.Step]++
			if i+1 >= len(evs) || (evs[i+1].Kind != runlog.Backward && evs[i+1].Kind != runlog.Input) || evs[i+1].MB != e.MB || evs[i+1].Chunk != e.Chunk {
				t.Fatalf("stage %d: step %d's RF of micro-batch %d chunk %d is not followed by its backward", st, e.Step, e.MB, e.Chunk)
			}
		}
		want := 0
		if modes[st] == "full" {
			want = units
		}
		for step := range 2 {
			if perStep[step] != want {
				t.Errorf("stage %d (recompute %q): %d recomputations in step %d, want %d", st, modes[st], perStep[step], step, want)
			}
		}
	}
}

// TestProfileShowsRecomputation: a run with recomputation keeps its schedule,
// RFs included, in run.json, and profile counts the RFs as the stage's work,
// in a column of their own, and simulates the schedule that ran.
func TestProfileShowsRecomputation(t *testing.T) {
	cfg := testConfig("1f1b", plain("0-1", "2-3"), 4, "float32", "sgd")
	cfg.Stages[0].Recompute = "full"
	dir := runInProcess(t, cfg, false)
	info, events, err := profile.ReadRun(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := profile.RunSchedule(info)
	if err != nil || !schedule.RecomputesChunk(s.Actions[0], 0) || schedule.RecomputesChunk(s.Actions[1], 0) {
		t.Fatalf("run.json's schedule: %v\n%v", err, s)
	}
	r, err := profile.Analyse(info, events, 1)
	if err != nil {
		t.Fatal(err)
	}
	if r.Stages[0].Recompute <= 0 || r.Stages[1].Recompute != 0 {
		t.Errorf("recomputation time per stage: %v and %v", r.Stages[0].Recompute, r.Stages[1].Recompute)
	}
	if got := r.Stages[0].Forward + r.Stages[0].Backward + r.Stages[0].Weight + r.Stages[0].Recompute; r.Stages[0].Busy != got {
		t.Errorf("stage 0 busy %v, its actions %v", r.Stages[0].Busy, got)
	}
	var b strings.Builder
	if err := r.Write(&b); err != nil {
		t.Fatal(err)
	}
	if head := strings.SplitN(b.String(), "\n", 2)[0]; !strings.Contains(head, "RF ") {
		t.Errorf("the report's first table has no RF column: %q", head)
	}
}
