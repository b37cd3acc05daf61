package stages

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/compute"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/optim"
	"github.com/pipetrain/pipetrain/runlog"
)

// CheckpointDir is where a run keeps its checkpoints (runlog.CheckpointDir).
func CheckpointDir(runDir string) string { return runlog.CheckpointDir(runDir) }

// optimName names an optimizer buffer of a parameter inside a checkpoint part.
func optimName(slot, param string) string { return "optim." + slot + "." + param }

func optimStepsKey(chunk int) string { return fmt.Sprintf("optim.steps.%d", chunk) }

// partTensors is everything the stage carries from one step to the next: its
// parameters and its optimizers' buffers.
func (k *checkpointer) partTensors() ([]checkpoint.Tensor, map[string]string, error) {
	var ts []checkpoint.Tensor
	meta := map[string]string{"stage": fmt.Sprint(k.stage), "training_digest": k.cfg.TrainingDigest()}
	for c, s := range k.chunks {
		o := k.optims[c]
		meta[optimStepsKey(c)] = strconv.FormatInt(o.Steps(), 10)
		if d, ok := s.(compute.OptimizerOnDevice); ok {
			if err := d.StoreOptimizer(o); err != nil {
				return nil, nil, fmt.Errorf("chunk %d: %w", c, err)
			}
		}
		for i, w := range s.Weights() {
			ts = append(ts, denseTensor(w.Name, w.Value))
			for j, slot := range o.SlotNames() {
				var v *tensor.Dense
				var err error
				if k.state != nil {
					v = k.state[c][j][i] // gathered from the replicas' shards
				} else if v, err = o.Slot(slot, i); err != nil {
					return nil, nil, err
				}
				ts = append(ts, denseTensor(optimName(slot, w.Name), v))
			}
		}
	}
	return ts, meta, nil
}

func denseTensor(name string, d *tensor.Dense) checkpoint.Tensor {
	t := checkpoint.Tensor{Name: name, Shape: d.Shape().Clone()}
	switch v := d.Data().(type) {
	case []float32:
		t.F32 = v
	case []float64:
		t.F64 = v
	}
	return t
}

// Coordinator commits checkpoints, and agrees where a restarted run resumes,
// for processes whose run directories are their own (cluster.Coordinator,
// through rank 0). Its calls block until every rank has made the same one.
type Coordinator interface {
	// Commit reports this process's part of step's checkpoint and returns
	// the step's manifest once every process has reported its part.
	Commit(ctx context.Context, step int, digest string, p checkpoint.Part) (*checkpoint.Manifest, error)
	// Resume reports the parts this process holds and returns the step
	// every process resumes from (0: the start).
	Resume(ctx context.Context, held []checkpoint.Held) (int, error)
}

// checkpointer keeps a stage's checkpoints: it writes the stage's part
// after a step (its parameters and optimizer state, all the stage carries
// from one step to the next), commits the parts in order in the background,
// and restores the stage from the newest complete checkpoint. The runtime
// says when.
type checkpointer struct {
	cfg           *configs.Config
	root          string // the run's checkpoint folder
	stage, stages int
	replica       int
	coord         Coordinator        // nil: the processes share the run directory
	chunks        []compute.Stage    // their weights, in host memory
	optims        []*optim.Optimizer // one per engine
	log           io.Writer
	name          string     // the process's, for its messages
	judge         *evalJudge // its state and the step's metric go into each part; may be nil
	// gather, set when the replicas shard the optimizer state, assembles
	// the whole state on every replica (replicaSync.gatherState); state
	// holds it while the part is written.
	gather     func(ctx context.Context, step int) (slotState, error)
	state      slotState
	commits    sync.WaitGroup // commits in progress
	lastCommit chan struct{}  // closed when the newest commit has ended
	// servers is the number of parameter servers whose parts a checkpoint
	// needs besides the stages' (0 without servers, and in the reference).
	servers int
}

// retention is which committed checkpoints pruning keeps.
func (k *checkpointer) retention() checkpoint.Retention {
	return checkpoint.Retention{Keep: k.cfg.Checkpoint.Keep, Best: k.cfg.Checkpoint.KeepBest}
}

// writes says whether this process writes checkpoint parts: one replica per
// stage on a shared run directory, every process on its own.
func (k *checkpointer) writes() bool { return k.replica == 0 || k.coord != nil }

// takesPart says whether this process has a hand in each checkpoint: it
// writes a part, or its replica holds a shard of the optimizer state the
// part needs.
func (k *checkpointer) takesPart() bool { return k.writes() || k.gather != nil }

// clearAfter removes the checkpoints after step first that this process
// must clear: a fresh run clears them all, as an older run's checkpoints in
// the same directory must never be resumed from. Stage 0 takes part in
// every step, so no stage can write one after first before it runs; it
// clears a shared run directory, and processes with run directories of
// their own clear their own.
func (k *checkpointer) clearAfter(first int) error {
	if (k.stage == 0 && k.replica == 0) || k.coord != nil {
		return checkpoint.RemoveAfter(k.root, first)
	}
	return nil
}

// save writes the stage's part of the checkpoint after step done,
// then commits it in the background: through the coordinator, or on a
// shared run directory by stage 0 once every stage's part is in.
func (k *checkpointer) save(ctx context.Context, done int) error {
	if k.gather != nil {
		state, err := k.gather(ctx, done)
		if err != nil {
			return fmt.Errorf("%s: checkpoint of step %d: %w", k.name, done, err)
		}
		k.state = state
		defer func() { k.state = nil }() // the whole state is held while the part is written, no longer
	}
	if !k.writes() {
		return nil
	}
	ts, meta, err := k.partTensors()
	if err != nil {
		return err
	}
	meta["step"] = fmt.Sprint(done)
	k.judge.record(done, meta, checkpoint.MetricKey)
	root := k.root
	part, err := checkpoint.WritePart(root, done, k.stage, ts, meta)
	if err != nil {
		return fmt.Errorf("stage %d: checkpoint of step %d: %w", k.stage, done, err)
	}
	if k.coord != nil {
		k.inOrder(func() { k.commitOverWire(ctx, root, done, part) })
		return nil
	}
	if k.stage != 0 {
		return nil
	}
	k.inOrder(func() {
		// A stage that dies before writing its part leaves this commit waiting;
		// the run then fails and stopping it cancels ctx.
		m, err := checkpoint.Commit(ctx, root, done, k.stages, k.servers, k.cfg.TrainingDigest(), k.retention(), 20*time.Millisecond)
		if err != nil {
			fmt.Fprintf(k.log, "stage 0: %v\n", err)
			return
		}
		fmt.Fprintf(k.log, "checkpoint of step %d committed (%s)\n", m.Step, partsOf(m))
	})
	return nil
}

// partsOf counts a committed checkpoint's parts for messages: the stages'
// and, with parameter servers, the servers'.
func partsOf(m *checkpoint.Manifest) string {
	if len(m.ServerParts) == 0 {
		return words.Count(len(m.Parts), "part")
	}
	return fmt.Sprintf("%s and %s", words.Count(len(m.Parts), "stage part"), words.Count(len(m.ServerParts), "server part"))
}

// inOrder runs commit in the background after the commits before it: a
// later step committed first would prune the earlier one's folder as a
// crash's leftover while its parts arrive.
func (k *checkpointer) inOrder(commit func()) {
	prev, ended := k.lastCommit, make(chan struct{})
	k.lastCommit = ended
	k.commits.Add(1)
	go func() {
		defer k.commits.Done()
		defer close(ended)
		if prev != nil {
			<-prev
		}
		commit()
	}()
}

// commitOverWire reports this process's part and, once the coordinator
// says every part is in, writes the step's manifest into this process's
// own checkpoint folder. The manifest names every stage's part, though
// this folder holds one; resuming needs only this process's.
func (k *checkpointer) commitOverWire(ctx context.Context, root string, done int, part checkpoint.Part) {
	m, err := k.coord.Commit(ctx, done, k.cfg.TrainingDigest(), part)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(k.log, "%s: %v\n", k.name, err)
		}
		return
	}
	if err := checkpoint.WriteManifest(root, m); err != nil {
		fmt.Fprintf(k.log, "%s: checkpoint of step %d: %v\n", k.name, done, err)
		return
	}
	if err := checkpoint.Prune(root, k.retention()); err != nil {
		// Another process pruning the same shared folder; the next commit
		// prunes again.
		fmt.Fprintf(k.log, "%s: pruning checkpoints: %v\n", k.name, err)
	}
	if k.stage == 0 && k.replica == 0 {
		fmt.Fprintf(k.log, "checkpoint of step %d committed (%s, reported over the wire)\n", m.Step, words.Count(len(m.Parts), "part"))
	}
}

// restore loads the newest complete checkpoint under the run directory into the
// stage and returns its step (0 if there is none). Checkpoints that are corrupt or
// from another config are passed over, saying why, as long as an older one can
// be used; when none can, resuming is an error. With a coordinator, the
// processes agree on the newest step every one of them holds.
func (k *checkpointer) restore(ctx context.Context) (int, error) {
	root := k.root
	if k.coord != nil {
		return k.restoreAgreed(ctx, root)
	}
	m, skipped, err := checkpoint.Latest(root, k.cfg.TrainingDigest())
	if err != nil {
		return 0, err
	}
	if bad := checkpoint.Unusable(skipped); m == nil && len(bad) > 0 {
		// Checkpoints exist but none can be used: starting over would throw
		// the run's progress away without being asked to.
		return 0, fmt.Errorf("no usable checkpoint in %s (the newest: %v); its checkpoints depend on the model, split, data, seed, optimizer, schedule and compute.blas_threads the run had",
			root, bad[0])
	}
	for _, s := range skipped {
		fmt.Fprintf(k.log, "%s: skipping checkpoint: %v\n", k.name, s)
	}
	if m == nil {
		fmt.Fprintf(k.log, "%s: no complete checkpoint in %s; starting from step 0\n", k.name, root)
		return 0, nil
	}
	if m.Stages != k.stages {
		return 0, fmt.Errorf("%s: checkpoint has %d stages, the config %d", m.Dir, m.Stages, k.stages)
	}
	if err := k.load(m.PartPath(k.stage)); err != nil {
		return 0, err
	}
	// Replica 0 wrote the stage's part; every replica starts from it.
	fmt.Fprintf(k.log, "%s: resumed from the checkpoint of step %d (%s)\n", k.name, m.Step, m.Dir)
	return m.Step, nil
}

// restoreAgreed resumes from the step the coordinator says every process
// holds, from this process's own part of it.
func (k *checkpointer) restoreAgreed(ctx context.Context, root string) (int, error) {
	held, err := checkpoint.HeldParts(root, k.stage, k.cfg.TrainingDigest())
	if err != nil {
		return 0, err
	}
	step, err := k.coord.Resume(ctx, held)
	if err != nil {
		return 0, err
	}
	if step == 0 {
		fmt.Fprintf(k.log, "%s: no checkpoint that every process holds; starting from step 0\n", k.name)
		return 0, nil
	}
	dir := checkpoint.StepDir(root, step)
	if err := k.load(filepath.Join(dir, checkpoint.PartFile(k.stage))); err != nil {
		return 0, err
	}
	fmt.Fprintf(k.log, "%s: resumed from the checkpoint of step %d, which every process holds (%s)\n", k.name, step, dir)
	return step, nil
}

// load fills the stage's parameters and optimizer state from its part.
func (k *checkpointer) load(path string) error {
	tensors, meta, err := checkpoint.Read(path)
	if err != nil {
		return err
	}
	if err := k.judge.restore(meta, path); err != nil {
		return err
	}
	byName := map[string]checkpoint.Tensor{}
	for _, t := range tensors {
		byName[t.Name] = t
	}
	for c, s := range k.chunks {
		o := k.optims[c]
		n, err := strconv.ParseInt(meta[optimStepsKey(c)], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: optimizer step count of chunk %d: %w", path, c, err)
		}
		o.SetSteps(n)
		ws := s.Weights()
		for i, w := range ws {
			if err := fill(byName, w.Name, w.Value); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for _, slot := range o.SlotNames() {
				if err := fillSlot(byName, optimName(slot, w.Name), o, slot, i, w.Value); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
			}
		}
		if err := s.LoadWeights(ws); err != nil {
			return fmt.Errorf("%s: chunk %d: %w", path, c, err)
		}
		if d, ok := s.(compute.OptimizerOnDevice); ok {
			if err := d.LoadOptimizer(o); err != nil {
				return fmt.Errorf("%s: chunk %d: %w", path, c, err)
			}
		}
	}
	return nil
}

// fillSlot restores slot of parameter i (whose value is w) from the
// checkpoint tensor name, which holds the whole state: a sharded optimizer
// takes its share of it, so a part resumes with any number of shards.
func fillSlot(byName map[string]checkpoint.Tensor, name string, o *optim.Optimizer, slot string, i int, w *tensor.Dense) error {
	if !o.Sharded() {
		v, err := o.Slot(slot, i)
		if err != nil {
			return err
		}
		return fill(byName, name, v)
	}
	full := tensor.New(tensor.Of(w.Dtype()), tensor.WithShape(w.Shape().Clone()...))
	if err := fill(byName, name, full); err != nil {
		return err
	}
	return o.ImportSlot(slot, i, full)
}

// fill copies a checkpoint tensor into a live one of the same name, shape and dtype.
func fill(byName map[string]checkpoint.Tensor, name string, dst *tensor.Dense) error {
	return checkpoint.CopyInto(byName, name, dst.Shape(), dst.Data())
}

// truncateJSONL keeps the lines of a JSONL log whose step field passes keep, so a
// resumed run's logs hold each step once.
func truncateJSONL(path string, keep func(step int) bool) error {
	f, err := os.Open(path)
	if os.IsNotExist(err) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	return checkpoint.WriteAtomic(path, func(w io.Writer) error {
		sc := bufio.NewScanner(f)
		sc.Buffer(make([]byte, 1<<20), 1<<26)
		for sc.Scan() {
			var s struct {
				Step *int `json:"step"`
			}
			// A line cut short by the crash has no step and is dropped.
			if json.Unmarshal(sc.Bytes(), &s) != nil || s.Step == nil || !keep(*s.Step) {
				continue
			}
			if _, err := w.Write(append(sc.Bytes(), '\n')); err != nil {
				return err
			}
		}
		return sc.Err()
	})
}

// rewindLogs drops what the failed attempt logged after the checkpoint it resumes
// from: events of steps >= start (0-based) and metrics of steps > start (1-based).
func (r *Runtime) rewindLogs(start int) error {
	if err := truncateJSONL(runlog.ReplicaEventsFile(r.runDir, r.stage, r.replica), func(s int) bool { return s >= 0 && s < start }); err != nil {
		return err
	}
	return r.files.rewind(start)
}

// await lets the process finish committing the last checkpoint before
// it exits, for at most the receive timeout: every other stage has written
// its part by the time it finishes the last step.
func (k *checkpointer) await(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		k.commits.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(k.cfg.Transport.RecvTimeout):
		fmt.Fprintf(k.log, "stage %d: the last checkpoint was not committed within %v\n", k.stage, k.cfg.Transport.RecvTimeout)
	}
}

// wait waits for every commit in progress to end.
func (k *checkpointer) wait() { k.commits.Wait() }
