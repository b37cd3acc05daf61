package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/stats"
	"github.com/pipetrain/pipetrain/runlog"
	"github.com/pipetrain/pipetrain/stages"
)

// psMode is one way a run's replicas combine their gradients: the ring
// (ps nil), or parameter servers with the settings ps.
type psMode struct {
	label string
	ps    map[string]any
}

// psModes are the MLP's: the ring, sync, backup workers and async with
// max_staleness 0, 1 and 4.
var psModes = []psMode{
	{"ring all-reduce (no servers)", nil},
	{"sync", map[string]any{"mode": "sync"}},
	{"sync, aggregate 2 of 3 (backup workers)", map[string]any{"mode": "sync", "aggregate": 2}},
	{"async, max_staleness 0", map[string]any{"mode": "async", "max_staleness": 0}},
	{"async, max_staleness 1", map[string]any{"mode": "async", "max_staleness": 1}},
	{"async, max_staleness 4", map[string]any{"mode": "async", "max_staleness": 4}},
}

// settings are the derived config's settings of m, with more.
func (m psMode) settings(more map[string]map[string]any) map[string]map[string]any {
	out := map[string]map[string]any{"parameter_servers": nil}
	if m.ps != nil {
		out["parameter_servers"] = map[string]any{}
		for k, v := range m.ps {
			out["parameter_servers"][k] = v
		}
	}
	for section, kv := range more {
		if out[section] == nil {
			out[section] = map[string]any{}
		}
		for k, v := range kv {
			out[section][k] = v
		}
	}
	return out
}

// psFigures are what one run measured.
type psFigures struct {
	sps            float64 // samples/s after the warm-up, of worker 0's steps
	loss, accuracy float64 // the final evaluation's
	dropped        int     // pushes the servers dropped
	pushes         int     // pushes the servers applied
	staleness      int64   // the applied pushes' staleness, summed
}

// runPS compares the ring all-reduce with parameter servers on the same
// processes: throughput and the loss after the same samples per mode, what
// one worker at half speed costs each, and the loss of a GPT per mode.
func runPS(o *options, b *bytes.Buffer) error {
	const mlp, gpt = "configs/fmnist-mlp-ps.yaml", "configs/gpt-small-4stage.yaml"
	reps := min(o.runReps, 2)
	gptSteps := 60
	if o.quick {
		gptSteps = 20
	}
	fmt.Fprintf(b, "`%s`: 2 stages × 3 workers (replicas of the pipeline), and for the servers' runs 2 parameter servers, each process one BLAS thread, %d steps of 192 examples, then the test set's evaluation of the final weights. ", mlp, o.e2eSteps)
	fmt.Fprintf(b, "The same 6 stage processes train with the replicas' ring all-reduce (no servers) and with each mode of the servers (8 processes); samples/s are worker 0's steps after the first %d (the run's `metrics.jsonl`), the median of %d runs, the modes alternating; the test loss and accuracy are the median run's. ", o.skip, reps)
	fmt.Fprintf(b, "Every run trains on the same examples in the same order, so the losses compare the cost of staleness after the same samples. Dropped and staleness are counted from the servers' event logs (`events/ps-<i>.jsonl`).\n\n")
	base := runConfig{base: mlp, steps: o.e2eSteps, evaluate: true, env: []string{"PIPETRAIN_COMPUTE_BLAS_THREADS=1"}}
	full := map[string][]psFigures{}
	for rep := range reps {
		for _, m := range psModes {
			rc := base
			rc.set = m.settings(nil)
			f, err := psRun(o, rc)
			if err != nil {
				return fmt.Errorf("%s: %w", m.label, err)
			}
			full[m.label] = append(full[m.label], f)
			logf("ps rep %d: %s: %.0f samples/s, test loss %.4f", rep+1, m.label, f.sps, f.loss)
		}
	}
	ring := medianRun(full[psModes[0].label]).sps
	fmt.Fprintf(b, "| run | samples/s | / ring | test loss | test accuracy | pushes dropped | mean staleness (updates) |\n|---|---|---|---|---|---|---|\n")
	for _, m := range psModes {
		f := medianRun(full[m.label])
		fmt.Fprintf(b, "| %s | %.0f | %s | %.4f | %.2f%% | %s | %s |\n", m.label, f.sps, ratio(f.sps/ring), f.loss, 100*f.accuracy, serverFigure(m, f.dropped), staleFigure(m, f))
	}

	fmt.Fprintf(b, "\n**One slow worker.** The same runs with worker 2 at about half speed (`%s=2`: before each push, each of its stages sleeps as long as its forward and backward passes of the step took). Sync waits for it every step; backup workers drop its pushes; async lets the others run at most max_staleness steps ahead of it, so a worker slow at every step still sets their pace, later.\n\n", stages.SlowReplicaEnv)
	fmt.Fprintf(b, "| run | samples/s, all at full speed | worker 2 at half speed | slowed / full | pushes dropped, slowed |\n|---|---|---|---|---|\n")
	for _, m := range psModes[1:] {
		if m.label == psModes[3].label {
			continue // async with max_staleness 0 updates as sync does
		}
		var slow []psFigures
		for range reps {
			rc := base
			rc.set, rc.env = m.settings(nil), append(append([]string(nil), base.env...), stages.SlowReplicaEnv+"=2")
			f, err := psRun(o, rc)
			if err != nil {
				return fmt.Errorf("%s, worker 2 slowed: %w", m.label, err)
			}
			slow = append(slow, f)
			logf("ps slowed: %s: %.0f samples/s", m.label, f.sps)
		}
		f, s := medianRun(full[m.label]), medianRun(slow)
		fmt.Fprintf(b, "| %s | %.0f | %.0f | %s | %s |\n", m.label, f.sps, s.sps, ratio(s.sps/f.sps), serverFigure(m, s.dropped))
	}

	fmt.Fprintf(b, "\n**A GPT.** `%s` with `tie_embeddings: false` (servers refuse tied weights) as 1 stage × 3 workers and 2 servers, batches of 48 windows (2 micro-batches per worker), %d steps, one run per mode; the validation loss of the final weights:\n\n", gpt, gptSteps)
	fmt.Fprintf(b, "| run | samples/s | validation loss | mean staleness (updates) |\n|---|---|---|---|\n")
	for _, m := range psModes[1:] {
		if strings.Contains(m.label, "aggregate") {
			continue
		}
		set := m.settings(map[string]map[string]any{"model": {"tie_embeddings": false}, "data": {"batch_size": 48, "micro_batches": 2}, "parameter_servers": {"count": 2}})
		rc := runConfig{base: gpt, steps: gptSteps, evaluate: true, layers: []string{"0-5"}, replicas: 3, set: set, env: base.env}
		f, err := psRun(o, rc)
		if err != nil {
			return fmt.Errorf("GPT, %s: %w", m.label, err)
		}
		logf("ps GPT: %s: %.0f samples/s, validation loss %.4f", m.label, f.sps, f.loss)
		fmt.Fprintf(b, "| %s | %.0f | %.4f | %s |\n", m.label, f.sps, f.loss, staleFigure(m, f))
	}
	return nil
}

// medianRun is the run of median samples/s among runs.
func medianRun(runs []psFigures) psFigures {
	var sps []float64
	for _, f := range runs {
		sps = append(sps, f.sps)
	}
	m := stats.Median(sps)
	best := runs[0]
	for _, f := range runs {
		if abs(f.sps-m) < abs(best.sps-m) {
			best = f
		}
	}
	return best
}

func abs(x float64) float64 { return max(x, -x) }

// serverFigure is n for a mode with servers, "-" for the ring.
func serverFigure(m psMode, n int) string {
	if m.ps == nil {
		return "-"
	}
	return fmt.Sprint(n)
}

// staleFigure is the applied pushes' mean staleness, "-" for the ring.
func staleFigure(m psMode, f psFigures) string {
	if m.ps == nil || f.pushes == 0 {
		return "-"
	}
	return fmt.Sprintf("%.2f", float64(f.staleness)/float64(f.pushes))
}

// psRun launches rc and returns its figures.
func psRun(o *options, rc runConfig) (psFigures, error) {
	var f psFigures
	dir, cfgPath, err := pipetrain(o, "launch", rc)
	if err != nil {
		return f, err
	}
	defer os.RemoveAll(dir)
	cfg, err := configs.Load(cfgPath)
	if err != nil {
		return f, err
	}
	runDir := filepath.Join(dir, "run")
	if _, f.sps, err = stepTimes(runDir, cfg.Data.BatchSize, o.skip); err != nil {
		return f, err
	}
	raw, err := os.ReadFile(filepath.Join(runDir, "eval.json"))
	if err != nil {
		return f, err
	}
	var eval struct{ Loss, Accuracy float64 }
	if err := json.Unmarshal(raw, &eval); err != nil {
		return f, fmt.Errorf("eval.json: %w", err)
	}
	f.loss, f.accuracy = eval.Loss, eval.Accuracy
	for i := range cfg.ParameterServers.Count {
		if err := countServer(runlog.PSEventsFile(runDir, i), &f); err != nil {
			return f, err
		}
	}
	return f, nil
}

// countServer adds a server's drops, applied pushes and their staleness
// from its event log to f.
func countServer(path string, f *psFigures) error {
	file, err := os.Open(path)
	if err != nil {
		return err
	}
	defer file.Close()
	sc := bufio.NewScanner(file)
	for sc.Scan() {
		var e runlog.PSEvent
		if err := json.Unmarshal(sc.Bytes(), &e); err != nil {
			return fmt.Errorf("%s: %w", path, err)
		}
		switch e.Kind {
		case runlog.PSDrop:
			f.dropped++
		case runlog.PSUpdate:
			f.pushes += len(e.Workers)
			for _, s := range e.Staleness {
				f.staleness += s
			}
		}
	}
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	if f.pushes == 0 {
		return errors.New(path + ": no updates logged")
	}
	return nil
}
