package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/data"
	"github.com/pipetrain/pipetrain/internal/blas"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/profile"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/schedule"
	"github.com/pipetrain/pipetrain/transport"
)

// synthetic is a small labelled dataset, so runtime tests need no installed data.
func synthetic(n, dim, classes int, seed uint64) *data.Dataset {
	r := rand.New(rand.NewPCG(seed, 0))
	d := &data.Dataset{Name: "synthetic", N: n, Dim: dim, Classes: classes, Images: make([]float32, n*dim), Labels: make([]uint8, n)}
	for i := range d.Images {
		d.Images[i] = r.Float32()
	}
	for i := range d.Labels {
		d.Labels[i] = uint8(r.IntN(classes))
	}
	return d
}

// testConfig is a small MLP run; layers[s] lists stage s's range per chunk.
func testConfig(sched string, layers [][]string, micro int, dtype, opt string) *configs.Config {
	n := 0 // layers the ranges cover
	for _, stage := range layers {
		for _, r := range stage {
			_, last, err := configs.ParseLayers(r)
			if err != nil {
				panic(err)
			}
			n = max(n, last+1)
		}
	}
	hidden := []int{7, 6, 5, 6, 7, 6, 5, 7}[:n-1]
	c := &configs.Config{
		Model:         models.Spec{Name: "mlp", DType: dtype, Input: 8, Hidden: hidden, Classes: 3, Activation: "relu"},
		Data:          configs.Data{Dataset: "fashion-mnist", BatchSize: 4 * micro, MicroBatches: micro},
		Train:         configs.Train{Steps: 6, Seed: 11, LogEvery: 2, Evaluate: true, Optimizer: configs.Optimizer{Name: opt, LR: 0.05, Momentum: 0.5, Beta1: 0.9, Beta2: 0.999, Eps: 1e-8}},
		Schedule:      sched,
		VirtualStages: len(layers[0]),
		Compute:       configs.Compute{BLASThreads: 1},
		Transport:     configs.Transport{ConnectTimeout: time.Second, QueueDepth: 2, RecvTimeout: 10 * time.Second, Heartbeat: time.Second, PeerTimeout: time.Second},
		Checkpoint:    configs.Checkpoint{Keep: 2},
	}
	for i, l := range layers {
		c.Stages = append(c.Stages, configs.Stage{Layers: l, Address: fmt.Sprintf("127.0.0.1:%d", 7000+i), Device: "cpu"})
	}
	return c
}

// plain gives each stage one chunk.
func plain(ranges ...string) [][]string {
	out := make([][]string, len(ranges))
	for i, r := range ranges {
		out[i] = []string{r}
	}
	return out
}

// runInProcess runs every stage of c as a goroutine, linked by in-memory pipes, and
// returns the run directory.
func runInProcess(t *testing.T, c *configs.Config, reference bool) string {
	t.Helper()
	dir, _ := runStages(t, c, reference)
	return dir
}

// runStages is runInProcess that also returns the finished runtimes.
func runStages(t *testing.T, c *configs.Config, reference bool) (string, []*Runtime) {
	t.Helper()
	return runStagesIn(t, c, reference, t.TempDir(), false)
}

// runStagesIn runs the stages in dir, resuming from its checkpoints if asked.
// pipeLinks joins n stages of c (1: none) by in-memory pipes, each stage to
// the next and, where the hellos ask for the ring, the last to the first;
// links[i] is stage i's [prev, next].
func pipeLinks(t *testing.T, c *configs.Config, n int) [][2]transport.Link {
	t.Helper()
	links := make([][2]transport.Link, n)
	for i := 0; i < n && n > 1; i++ {
		j := (i + 1) % n
		_, down, err := Hellos(c, i)
		if err != nil {
			t.Fatal(err)
		}
		up, _, err := Hellos(c, j)
		if err != nil {
			t.Fatal(err)
		}
		if j == 0 && !down.Ring {
			break
		}
		a, b := transport.Pipe(down, up, c.Transport.QueueDepth)
		links[i][1], links[j][0] = a, b
	}
	return links
}

// sameMLPRun compares a pipelined MLP run with its reference: evaluation,
// every weight and every step's loss, bit for bit.
func sameMLPRun(t *testing.T, cfg *configs.Config, ref, pipe string) {
	t.Helper()
	sameFile(t, filepath.Join(ref, "eval.json"), filepath.Join(pipe, "eval.json"))
	wr, wp := readWeights(t, ref), readWeights(t, pipe)
	if want := 2 * (len(cfg.Model.Hidden) + 1); len(wr) != want || len(wp) != len(wr) {
		t.Fatalf("reference has %d tensors, pipeline %d, model %d", len(wr), len(wp), want)
	}
	if err := checkpoint.Diff(wr, wp); err != nil {
		t.Fatalf("reference and pipeline weights differ: %v", err)
	}
	lr, lp := readLosses(t, ref), readLosses(t, pipe)
	if len(lr) != cfg.Train.Steps || fmt.Sprint(lr) != fmt.Sprint(lp) {
		t.Errorf("losses differ:\nreference %v\npipeline  %v", lr, lp)
	}
}

func runStagesIn(t *testing.T, c *configs.Config, reference bool, dir string, resume bool) (string, []*Runtime) {
	t.Helper()
	rts, errs := runPausable(t, c, reference, dir, resume, nil)
	failed := false
	for i, err := range errs {
		if err != nil {
			t.Errorf("stage %d: %v", i, err)
			failed = true
		}
	}
	if failed {
		t.FailNow()
	}
	return dir, rts
}

// runPausable runs the stages in dir as runStagesIn does, stage i with
// pauses[i] (none if pauses is nil), and returns each stage's error.
func runPausable(t *testing.T, c *configs.Config, reference bool, dir string, resume bool, pauses []*Pause) ([]*Runtime, []error) {
	t.Helper()
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	train, test := synthetic(96, 8, 3, 1), synthetic(30, 8, 3, 2)
	var text *data.Text
	if c.Data.Dataset == "text" {
		text = testText(t)
	} else if c.Model.Name == "cnn" {
		train, test = synthetic(96, c.Model.Input, c.Model.Classes, 1), synthetic(30, c.Model.Input, c.Model.Classes, 2)
	}
	n := len(c.Stages)
	if reference {
		n = 1
	}
	links := pipeLinks(t, c, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	var rts []*Runtime
	for i := 0; i < n; i++ {
		var pause *Pause
		if pauses != nil {
			pause = pauses[i]
		}
		rt, err := New(Options{Config: c, Stage: i, Reference: reference, RunDir: dir, Prev: links[i][0], Next: links[i][1], Train: train, Test: test, Text: text, Resume: resume, Pause: pause})
		if err != nil {
			t.Fatal(err)
		}
		rts = append(rts, rt)
		wg.Go(func() {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			defer cancel()
			errs[i] = rt.Run(ctx)
			for _, l := range links[i] {
				if l != nil {
					l.Close()
				}
			}
		})
	}
	wg.Wait()
	return rts, errs
}

func readWeights(t *testing.T, dir string) map[string]checkpoint.Tensor {
	t.Helper()
	w, err := checkpoint.ReadAll(filepath.Join(dir, "weights"))
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func sameFile(t *testing.T, a, b string) {
	t.Helper()
	x, err1 := os.ReadFile(a)
	y, err2 := os.ReadFile(b)
	if err1 != nil || err2 != nil {
		t.Fatal(err1, err2)
	}
	if string(x) != string(y) {
		t.Errorf("%s differs from %s:\n%s\n%s", a, b, x, y)
	}
}

// TestPipelineEqualsReference is the in-process form of pipetrain's first test: a
// pipelined run gives the same losses (bit for bit), evaluation and final weights as
// the same model trained in one runtime, for every schedule and several (p, m, v).
func TestPipelineEqualsReference(t *testing.T) {
	type tc struct {
		sched  string
		layers [][]string
		micro  []int
	}
	var cases []tc
	for _, sched := range []string{"gpipe", "1f1b", "zb-h1"} {
		for _, split := range [][][]string{plain("0-1", "2-3"), plain("0", "1-2", "3"), plain("0", "1", "2", "3")} {
			cases = append(cases, tc{sched, split, []int{1, 3, 5}})
		}
	}
	cases = append(cases,
		tc{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, []int{2, 4}},
		tc{"interleaved", [][]string{{"0", "3"}, {"1", "4"}, {"2", "5"}}, []int{3, 6}},
		tc{"interleaved", [][]string{{"0", "2", "4"}, {"1", "3", "5"}}, []int{4}},
		tc{"interleaved", [][]string{{"0-1", "4"}, {"2", "5"}, {"3", "6-7"}}, []int{3}},
	)
	for _, c := range cases {
		for _, micro := range c.micro {
			for _, opt := range []string{"adam", "sgd"} {
				name := fmt.Sprintf("%s/p%d/v%d/m%d/%s", c.sched, len(c.layers), len(c.layers[0]), micro, opt)
				t.Run(name, func(t *testing.T) {
					cfg := testConfig(c.sched, c.layers, micro, "float64", opt)
					sameMLPRun(t, cfg, runInProcess(t, cfg, true), runInProcess(t, cfg, false))
				})
			}
		}
	}
}

func readLosses(t *testing.T, dir string) []float64 {
	t.Helper()
	ms, err := ReadMetrics(filepath.Join(dir, "metrics.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	var out []float64
	for _, m := range ms {
		out = append(out, m.Loss)
	}
	return out
}

// TestStashFollowsSchedule checks the activations each stage held, as recorded in
// its events: what the schedule predicts (PeakInFlight), which is p-s under 1F1B,
// m under GPipe and min((v+1)p-1, mv) micro-batch chunks under interleaved-zb.
func TestStashFollowsSchedule(t *testing.T) {
	cases := []struct {
		sched  string
		layers [][]string
		micro  int
	}{
		{"gpipe", plain("0", "1", "2", "3"), 6},
		{"1f1b", plain("0", "1", "2", "3"), 6},
		{"zb-h1", plain("0", "1", "2", "3"), 6},
		{"interleaved", [][]string{{"0", "2"}, {"1", "3"}}, 4},
		{"interleaved-zb", [][]string{{"0", "3"}, {"1", "4"}, {"2", "5"}}, 6},
	}
	for _, tc := range cases {
		c := testConfig(tc.sched, tc.layers, tc.micro, "float32", "adam")
		dir := runInProcess(t, c, false)
		_, events, err := profile.ReadRun(dir)
		if err != nil {
			t.Fatal(err)
		}
		sched, err := schedule.Build(tc.sched, len(tc.layers), tc.micro, len(tc.layers[0]))
		if err != nil {
			t.Fatal(err)
		}
		want := sched.PeakInFlight()
		for s, evs := range events {
			peak := 0
			for _, e := range evs {
				peak = max(peak, e.Stashed)
			}
			if peak != want[s] {
				t.Errorf("%s stage %d: peak stash %d, schedule says %d", tc.sched, s, peak, want[s])
			}
			if tc.sched == "1f1b" && peak != len(tc.layers)-s {
				t.Errorf("1f1b stage %d: peak %d, want p-s = %d", s, peak, len(tc.layers)-s)
			}
			if tc.sched == "gpipe" && peak != tc.micro {
				t.Errorf("gpipe stage %d: peak %d, want m = %d", s, peak, tc.micro)
			}
			if p, v := len(tc.layers), len(tc.layers[0]); tc.sched == "interleaved-zb" && peak != min((v+1)*p-1, tc.micro*v) {
				t.Errorf("interleaved-zb stage %d: peak %d, want min((v+1)p-1, mv) = %d", s, peak, min((v+1)*p-1, tc.micro*v))
			}
		}
	}
}

func TestLossFalls(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "adam")
	c.Train.Steps = 40
	c.Train.Optimizer.LR = 0.01
	losses := readLosses(t, runInProcess(t, c, false))
	if !(losses[len(losses)-1] < losses[0]) {
		t.Errorf("loss did not fall: first %v last %v", losses[0], losses[len(losses)-1])
	}
}

// secondStage builds stage 1 of c's two stages alone; the test plays stage 0
// through the returned end of its link.
func secondStage(t *testing.T, c *configs.Config, dir string) (transport.Link, *Runtime) {
	t.Helper()
	_, down, err := Hellos(c, 0)
	if err != nil {
		t.Fatal(err)
	}
	up, _, err := Hellos(c, 1)
	if err != nil {
		t.Fatal(err)
	}
	peer, link := transport.Pipe(down, up, 2)
	rt, err := New(Options{Config: c, Stage: 1, RunDir: dir, Prev: link, Train: synthetic(96, 8, 3, 1), Test: synthetic(30, 8, 3, 2)})
	if err != nil {
		t.Fatal(err)
	}
	return peer, rt
}

// TestStalledNeighbourTimesOut runs stage 1 of 2 against a stage 0 that connects
// but never sends: the wait must end at transport.recv_timeout, naming the peer.
func TestStalledNeighbourTimesOut(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	c.Transport.RecvTimeout = 200 * time.Millisecond
	silent, rt := secondStage(t, c, t.TempDir())
	defer silent.Close()
	start := time.Now()
	err := rt.Run(context.Background())
	if err == nil {
		t.Fatal("stage ran without input")
	}
	for _, want := range []string{"stage 1, step 1", "waiting for activation of step 1 micro-batch 0 from stage 0 (127.0.0.1:7000)", "recv_timeout 200ms"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("gave up after %v", took)
	}
	// The status a launcher reads names the op the stage gave up in and the
	// stage it waited for.
	if a := rt.Activity(); a.Action != "1F0<0" || a.Peer != 0 {
		t.Errorf("status after the timeout: %+v, want op 1F0<0 waiting for stage 0", a)
	}
}

// TestCheckOpsRefusesWrongPeer: an op whose peer is not the neighbour at the
// end of its link, or that needs a link the stage lacks, is refused before
// anything runs.
func TestCheckOpsRefusesWrongPeer(t *testing.T) {
	c := testConfig("1f1b", plain("0-1", "2-3"), 2, "float32", "sgd")
	peer, rt := secondStage(t, c, t.TempDir())
	defer peer.Close()
	f0 := schedule.Action{Stage: 1, Kind: schedule.Forward}
	if err := rt.exec.check(rt.ops); err != nil {
		t.Fatalf("the stage's own ops: %v", err)
	}
	for _, tc := range []struct {
		op   schedule.Op
		want string
	}{
		{schedule.Op{Kind: schedule.RecvAct, Action: f0, Peer: 3}, "1F0<3: the link it travels on leads to stage 0"},
		{schedule.Op{Kind: schedule.SendAct, Action: f0, Peer: 2}, "1F0>2: this stage has no link for it"},
	} {
		if err := rt.exec.check([]schedule.Op{tc.op}); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: got %v, want %q", tc.op, err, tc.want)
		}
	}
}

// TestCustomScheduleTrainsLikeReference runs a hand-written schedule file:
// every step's loss, the evaluation and the final weights equal the
// reference's bit for bit.
func TestCustomScheduleTrainsLikeReference(t *testing.T) {
	file := filepath.Join(t.TempDir(), "mine.csv")
	text := "0F0,0F1,0F2,0B0,0B1,0F3,0B2,0B3\n1F0,1B0,1F1,1F2,1B1,1B2,1F3,1B3\n"
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c := testConfig("custom", plain("0-1", "2-3"), 4, "float64", "adam")
	c.ScheduleFile = file
	sameMLPRun(t, c, runInProcess(t, c, true), runInProcess(t, c, false))
}

// TestHandLoweredScheduleTrainsLikeReference runs a schedule file written
// lowered, with stage 1 receiving micro-batch 1's activation before it runs
// micro-batch 0's backward: the stages execute the ops as written and still
// train exactly the reference's model.
func TestHandLoweredScheduleTrainsLikeReference(t *testing.T) {
	s, err := schedule.Build("1f1b", 2, 4, 1)
	if err != nil {
		t.Fatal(err)
	}
	l, err := schedule.Lower(s)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.Replace(l.Grid(), "1B0 1B0>0 1F1<0 1F1", "1F1<0 1B0 1B0>0 1F1", 1)
	if text == l.Grid() {
		t.Fatalf("the edit did not apply to:\n%s", text)
	}
	file := filepath.Join(t.TempDir(), "mine.txt")
	if err := os.WriteFile(file, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	c := testConfig("custom", plain("0-1", "2-3"), 4, "float64", "adam")
	c.ScheduleFile = file
	peer, rt := secondStage(t, c, t.TempDir())
	peer.Close()
	var ops []string
	for _, o := range rt.ops {
		ops = append(ops, o.String())
	}
	if got := strings.Join(ops, " "); !strings.Contains(got, "1F1<0 1B0 1B0>0 1F1") {
		t.Fatalf("stage 1 does not run the ops as written: %s", got)
	}
	ref, pipe := runInProcess(t, c, true), runInProcess(t, c, false)
	if lr, lp := readLosses(t, ref), readLosses(t, pipe); fmt.Sprint(lr) != fmt.Sprint(lp) {
		t.Errorf("losses differ:\nreference %v\nhand-lowered %v", lr, lp)
	}
	sameWeights(t, ref, pipe)
}

// TestMetricsServed runs two stages, then reads each one's Prometheus metrics over
// HTTP on loopback.
func TestMetricsServed(t *testing.T) {
	c := testConfig("zb-h1", plain("0-1", "2-3"), 3, "float32", "adam")
	_, rts := runStages(t, c, false)
	for i, rt := range rts {
		stop, addr, err := ServeMetrics("127.0.0.1:0", rt.Metrics())
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.Get("http://" + addr + "/metrics")
		if err != nil {
			stop()
			t.Fatal(err)
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		stop()
		text := string(body)
		want := []string{
			fmt.Sprintf(`pipetrain_steps_total{stage="%d"} 6`, i),
			fmt.Sprintf(`pipetrain_action_seconds_count{stage="%d",kind="F"} 18`, i),
			fmt.Sprintf(`pipetrain_action_seconds_count{stage="%d",kind="W"} 18`, i),
			fmt.Sprintf(`pipetrain_action_seconds_count{stage="%d",kind="OPT"} 6`, i),
			fmt.Sprintf(`pipetrain_stashed_microbatches{stage="%d"} 0`, i),
			fmt.Sprintf(`pipetrain_samples_total{stage="%d"} %d`, i, 6*c.Data.BatchSize),
			"# TYPE pipetrain_queue_depth gauge",
		}
		link := "next"
		if i == 1 {
			link = "prev"
		}
		want = append(want, fmt.Sprintf(`pipetrain_queue_depth{stage="%d",link=%q,queue="send"}`, i, link),
			fmt.Sprintf(`pipetrain_sent_bytes_total{stage="%d",link=%q} `, i, link),
			fmt.Sprintf(`pipetrain_received_bytes_total{stage="%d",link=%q} `, i, link))
		for _, w := range want {
			if !strings.Contains(text, w) {
				t.Errorf("stage %d metrics lack %q:\n%s", i, w, text)
			}
		}
		if strings.Contains(text, fmt.Sprintf(`pipetrain_sent_bytes_total{stage="%d",link=%q} 0`, i, link)) ||
			strings.Contains(text, fmt.Sprintf(`pipetrain_received_bytes_total{stage="%d",link=%q} 0`, i, link)) {
			t.Errorf("stage %d moved nothing on its %s link:\n%s", i, link, text)
		}
	}
}

// TestRunInfoSaysWhatItComputedWith: run.json records the BLAS, its threads
// and the float32 kernels stage 0's process used.
func TestRunInfoSaysWhatItComputedWith(t *testing.T) {
	c := testConfig("1f1b", plain("0", "1"), 2, "float32", "sgd")
	dir := runInProcess(t, c, false)
	b, err := os.ReadFile(runlog.RunFile(dir))
	if err != nil {
		t.Fatal(err)
	}
	var info runlog.RunInfo
	if err := json.Unmarshal(b, &info); err != nil {
		t.Fatal(err)
	}
	core, why := blas.Kernels()
	want := runlog.Compute{BLAS: blas.Name(), BLASThreads: c.Threads(0), Kernels: models.Kernels(), BLASKernels: core, BLASKernelsReason: why}
	if info.Compute == nil || *info.Compute != want {
		t.Errorf("run.json compute %+v, want %+v", info.Compute, want)
	}
}
