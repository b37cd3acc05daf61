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
	"time"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/runlog"
)

// CheckpointDir is where a run keeps its checkpoints (runlog.CheckpointDir).
func CheckpointDir(runDir string) string { return runlog.CheckpointDir(runDir) }

// optimName names an optimizer buffer of a parameter inside a checkpoint part.
func optimName(slot, param string) string { return "optim." + slot + "." + param }

func optimStepsKey(chunk int) string { return fmt.Sprintf("optim.steps.%d", chunk) }

// partTensors is everything the stage carries from one step to the next: its
// parameters and its optimizers' buffers.
func (r *Runtime) partTensors() ([]checkpoint.Tensor, map[string]string, error) {
	var ts []checkpoint.Tensor
	meta := map[string]string{"stage": fmt.Sprint(r.stage), "training_digest": r.cfg.TrainingDigest()}
	for c, e := range r.engines {
		o := r.optims[c]
		meta[optimStepsKey(c)] = strconv.FormatInt(o.Steps(), 10)
		for i, p := range e.Params() {
			ts = append(ts, denseTensor(p.Name(), p.Value().(*tensor.Dense)))
			for _, slot := range o.SlotNames() {
				v, err := o.Slot(slot, i)
				if err != nil {
					return nil, nil, err
				}
				ts = append(ts, denseTensor(optimName(slot, p.Name()), v))
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

// writesCheckpoints says whether this process writes checkpoint parts: one
// replica per stage on a shared run directory, every process on its own.
func (r *Runtime) writesCheckpoints() bool { return r.replica == 0 || r.coord != nil }

// saveCheckpoint writes the stage's part of the checkpoint after step done,
// then commits it in the background: through the coordinator, or on a
// shared run directory by stage 0 once every stage's part is in.
func (r *Runtime) saveCheckpoint(ctx context.Context, done int) error {
	ts, meta, err := r.partTensors()
	if err != nil {
		return err
	}
	meta["step"] = fmt.Sprint(done)
	root := CheckpointDir(r.runDir)
	part, err := checkpoint.WritePart(root, done, r.stage, ts, meta)
	if err != nil {
		return fmt.Errorf("stage %d: checkpoint of step %d: %w", r.stage, done, err)
	}
	if r.coord != nil {
		r.inOrder(func() { r.commitOverWire(ctx, root, done, part) })
		return nil
	}
	if r.stage != 0 {
		return nil
	}
	r.inOrder(func() {
		// A stage that dies before writing its part leaves this commit waiting;
		// the run then fails and stopping it cancels ctx.
		m, err := checkpoint.Commit(ctx, root, done, r.stages, r.cfg.TrainingDigest(), r.cfg.Checkpoint.Keep, 20*time.Millisecond)
		if err != nil {
			fmt.Fprintf(r.log, "stage 0: %v\n", err)
			return
		}
		fmt.Fprintf(r.log, "checkpoint of step %d committed (%s)\n", m.Step, words.Count(len(m.Parts), "part"))
	})
	return nil
}

// inOrder runs commit in the background after the commits before it: a
// later step committed first would prune the earlier one's folder as a
// crash's leftover while its parts arrive.
func (r *Runtime) inOrder(commit func()) {
	prev, ended := r.lastCommit, make(chan struct{})
	r.lastCommit = ended
	r.commits.Add(1)
	go func() {
		defer r.commits.Done()
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
func (r *Runtime) commitOverWire(ctx context.Context, root string, done int, part checkpoint.Part) {
	m, err := r.coord.Commit(ctx, done, r.cfg.TrainingDigest(), part)
	if err != nil {
		if ctx.Err() == nil {
			fmt.Fprintf(r.log, "%s: %v\n", r.name(), err)
		}
		return
	}
	if err := checkpoint.WriteManifest(root, m); err != nil {
		fmt.Fprintf(r.log, "%s: checkpoint of step %d: %v\n", r.name(), done, err)
		return
	}
	if err := checkpoint.Prune(root, r.cfg.Checkpoint.Keep); err != nil {
		// Another process pruning the same shared folder; the next commit
		// prunes again.
		fmt.Fprintf(r.log, "%s: pruning checkpoints: %v\n", r.name(), err)
	}
	if r.stage == 0 && r.replica == 0 {
		fmt.Fprintf(r.log, "checkpoint of step %d committed (%s, reported over the wire)\n", m.Step, words.Count(len(m.Parts), "part"))
	}
}

// restore loads the newest complete checkpoint under the run directory into the
// stage and returns its step (0 if there is none). Checkpoints that are corrupt or
// from another config are passed over, saying why, as long as an older one can
// be used; when none can, resuming is an error. With a coordinator, the
// processes agree on the newest step every one of them holds.
func (r *Runtime) restore(ctx context.Context) (int, error) {
	root := CheckpointDir(r.runDir)
	if r.coord != nil {
		return r.restoreAgreed(ctx, root)
	}
	m, skipped, err := checkpoint.Latest(root, r.cfg.TrainingDigest())
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
		fmt.Fprintf(r.log, "%s: skipping checkpoint: %v\n", r.name(), s)
	}
	if m == nil {
		fmt.Fprintf(r.log, "%s: no complete checkpoint in %s; starting from step 0\n", r.name(), root)
		return 0, nil
	}
	if m.Stages != r.stages {
		return 0, fmt.Errorf("%s: checkpoint has %d stages, the config %d", m.Dir, m.Stages, r.stages)
	}
	if err := r.load(m.PartPath(r.stage)); err != nil {
		return 0, err
	}
	// Replica 0 wrote the stage's part; every replica starts from it.
	fmt.Fprintf(r.log, "%s: resumed from the checkpoint of step %d (%s)\n", r.name(), m.Step, m.Dir)
	return m.Step, nil
}

// restoreAgreed resumes from the step the coordinator says every process
// holds, from this process's own part of it.
func (r *Runtime) restoreAgreed(ctx context.Context, root string) (int, error) {
	held, err := checkpoint.HeldParts(root, r.stage, r.cfg.TrainingDigest())
	if err != nil {
		return 0, err
	}
	step, err := r.coord.Resume(ctx, held)
	if err != nil {
		return 0, err
	}
	if step == 0 {
		fmt.Fprintf(r.log, "%s: no checkpoint that every process holds; starting from step 0\n", r.name())
		return 0, nil
	}
	dir := checkpoint.StepDir(root, step)
	if err := r.load(filepath.Join(dir, checkpoint.PartFile(r.stage))); err != nil {
		return 0, err
	}
	fmt.Fprintf(r.log, "%s: resumed from the checkpoint of step %d, which every process holds (%s)\n", r.name(), step, dir)
	return step, nil
}

// load fills the stage's parameters and optimizer state from its part.
func (r *Runtime) load(path string) error {
	tensors, meta, err := checkpoint.Read(path)
	if err != nil {
		return err
	}
	byName := map[string]checkpoint.Tensor{}
	for _, t := range tensors {
		byName[t.Name] = t
	}
	for c, e := range r.engines {
		o := r.optims[c]
		n, err := strconv.ParseInt(meta[optimStepsKey(c)], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: optimizer step count of chunk %d: %w", path, c, err)
		}
		o.SetSteps(n)
		for i, p := range e.Params() {
			if err := fill(byName, p.Name(), p.Value().(*tensor.Dense)); err != nil {
				return fmt.Errorf("%s: %w", path, err)
			}
			for _, slot := range o.SlotNames() {
				v, err := o.Slot(slot, i)
				if err != nil {
					return err
				}
				if err := fill(byName, optimName(slot, p.Name()), v); err != nil {
					return fmt.Errorf("%s: %w", path, err)
				}
			}
		}
	}
	return nil
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

// awaitCommits lets the process finish committing the last checkpoint before
// it exits, for at most the receive timeout: every other stage has written
// its part by the time it finishes the last step.
func (r *Runtime) awaitCommits(ctx context.Context) {
	done := make(chan struct{})
	go func() {
		r.commits.Wait()
		close(done)
	}()
	select {
	case <-done:
	case <-ctx.Done():
	case <-time.After(r.cfg.Transport.RecvTimeout):
		fmt.Fprintf(r.log, "stage %d: the last checkpoint was not committed within %v\n", r.stage, r.cfg.Transport.RecvTimeout)
	}
}
