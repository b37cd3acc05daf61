package stages

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"

	"gorgonia.org/tensor"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/ps"
)

// Parameter servers' checkpoints. Each server keeps its groups' states as
// they make the update of a step the run checkpoints after (ps.Settings'
// CheckpointAt), and writes them as its part of that step's checkpoint,
// ps-I.safetensors beside the stages' parts: the weights and optimizer state
// of every stage it serves, with the update counts and counters. Stage 0
// commits the step once every stage's and every server's part is in
// (checkpoint.Commit), and a resumed server starts from its part of the
// newest committed step, as the stages do from theirs.

// psGroupsKey is the server part's metadata key that lists its groups.
const psGroupsKey = "ps.groups"

// psGroupMeta is what a server part records of a group besides its tensors.
type psGroupMeta struct {
	Stage     int             `json:"stage"`
	Version   int64           `json:"version"`
	Tensors   []string        `json:"tensors"`
	Slots     []string        `json:"optimizer_slots,omitempty"`
	OptSteps  int64           `json:"optimizer_steps"`
	Dropped   []int64         `json:"dropped"`
	Staleness map[int64]int64 `json:"staleness,omitempty"`
}

// psCheckpointAt says after which updates the servers keep their state for
// a checkpoint: the steps the stages checkpoint after (checkpointsAfter),
// an update being a step in the modes that checkpoint.
func psCheckpointAt(c *configs.Config) func(int64) bool {
	every, steps := int64(c.Checkpoint.Every), int64(c.Train.Steps)
	return func(v int64) bool { return every > 0 && v > 0 && (v%every == 0 || v == steps) }
}

// nextPSCheckpoint is the step after step that the run checkpoints after,
// 0 when there is none.
func nextPSCheckpoint(c *configs.Config, step int) int {
	every, steps := c.Checkpoint.Every, c.Train.Steps
	if every <= 0 || step >= steps {
		return 0
	}
	return min((step/every+1)*every, steps)
}

// writePSCheckpoints writes server i's part of each checkpoint after step
// from, as its groups reach it, until the run ends.
func writePSCheckpoints(ctx context.Context, c *configs.Config, i int, srv *ps.Server, groups int, runDir string, from int) error {
	root := CheckpointDir(runDir)
	for step := nextPSCheckpoint(c, from); step > 0; step = nextPSCheckpoint(c, step) {
		states, err := srv.Snapshot(ctx, int64(step), groups)
		if err != nil {
			return err
		}
		if states == nil {
			return nil // the run stopped before the step
		}
		ts, meta := psPartTensors(c, states)
		meta["step"] = strconv.Itoa(step)
		if _, err := checkpoint.WriteServerPart(root, step, i, ts, meta); err != nil {
			return fmt.Errorf("checkpoint of step %d: %w", step, err)
		}
	}
	return nil
}

// psPartTensors are a server part's tensors, the weights by name and the
// optimizer's buffers as a stage's part names them (optimName), and its
// metadata.
func psPartTensors(c *configs.Config, states []ps.GroupState) ([]checkpoint.Tensor, map[string]string) {
	var ts []checkpoint.Tensor
	var groups []psGroupMeta
	for _, st := range states {
		slots := slices.Sorted(maps.Keys(st.Slots))
		for k, name := range st.Names {
			ts = append(ts, denseTensor(name, st.Params[k]))
			for _, slot := range slots {
				ts = append(ts, denseTensor(optimName(slot, name), st.Slots[slot][k]))
			}
		}
		groups = append(groups, psGroupMeta{Stage: st.Stage, Version: st.Version, Tensors: st.Names, Slots: slots,
			OptSteps: st.OptSteps, Dropped: st.Dropped, Staleness: st.Staleness})
	}
	b, _ := json.Marshal(groups)
	return ts, map[string]string{psGroupsKey: string(b), "training_digest": c.TrainingDigest()}
}

// restorePS starts server i from its part of the newest committed
// checkpoint under runDir and returns the checkpoint's step; 0, with the
// server left empty, when there is none.
func restorePS(c *configs.Config, i int, srv *ps.Server, runDir string, log io.Writer) (int, error) {
	root := CheckpointDir(runDir)
	m, skipped, err := checkpoint.Latest(root, c.TrainingDigest())
	if err != nil {
		return 0, err
	}
	if bad := checkpoint.Unusable(skipped); m == nil && len(bad) > 0 {
		return 0, fmt.Errorf("no usable checkpoint in %s (the newest: %v)", root, bad[0])
	}
	if m == nil {
		fmt.Fprintf(log, "%s: no complete checkpoint in %s; starting from step 0\n", configs.PSName(i), root)
		return 0, nil
	}
	if m.Servers != c.ParameterServers.Count {
		return 0, fmt.Errorf("%s: the checkpoint has parts of %d parameter servers, the config %d", m.Dir, m.Servers, c.ParameterServers.Count)
	}
	path := m.ServerPartPath(i)
	states, err := readPSPart(path)
	if err != nil {
		return 0, err
	}
	for _, st := range states {
		if st.Version != int64(m.Step) {
			return 0, fmt.Errorf("%s: stage %d's group is at update %d, the checkpoint of step %d", path, st.Stage, st.Version, m.Step)
		}
	}
	if err := srv.Restore(states); err != nil {
		return 0, fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(log, "%s: resumed from the checkpoint of step %d (%s)\n", configs.PSName(i), m.Step, m.Dir)
	return m.Step, nil
}

// readPSPart reads a server part's groups.
func readPSPart(path string) ([]ps.GroupState, error) {
	tensors, meta, err := checkpoint.Read(path)
	if err != nil {
		return nil, err
	}
	var groups []psGroupMeta
	if err := json.Unmarshal([]byte(meta[psGroupsKey]), &groups); err != nil {
		return nil, fmt.Errorf("%s: metadata %s: %w", path, psGroupsKey, err)
	}
	byName := map[string]checkpoint.Tensor{}
	for _, t := range tensors {
		byName[t.Name] = t
	}
	var out []ps.GroupState
	for _, g := range groups {
		st := ps.GroupState{Stage: g.Stage, Version: g.Version, Names: g.Tensors, OptSteps: g.OptSteps, Dropped: g.Dropped,
			Staleness: g.Staleness, Slots: map[string][]*tensor.Dense{}}
		for _, name := range g.Tensors {
			p, err := denseOf(byName, name)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", path, err)
			}
			st.Params = append(st.Params, p)
			for _, slot := range g.Slots {
				v, err := denseOf(byName, optimName(slot, name))
				if err != nil {
					return nil, fmt.Errorf("%s: %w", path, err)
				}
				st.Slots[slot] = append(st.Slots[slot], v)
			}
		}
		out = append(out, st)
	}
	return out, nil
}

// denseOf is the part's tensor name as a tensor.
func denseOf(byName map[string]checkpoint.Tensor, name string) (*tensor.Dense, error) {
	t, ok := byName[name]
	switch {
	case !ok:
		return nil, fmt.Errorf("no tensor %s", name)
	case t.F64 != nil:
		return tensor.New(tensor.WithShape(t.Shape...), tensor.WithBacking(t.F64)), nil
	}
	return tensor.New(tensor.WithShape(t.Shape...), tensor.WithBacking(t.F32)), nil
}
