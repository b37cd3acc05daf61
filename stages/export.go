package stages

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/internal/words"
	"github.com/pipetrain/pipetrain/models"
	"github.com/pipetrain/pipetrain/runlog"
)

// Which weights of a run Export takes: its final weights, its newest
// committed checkpoint, or the checkpoint of a given step (> 0).
const (
	FinalWeights     = 0
	LatestCheckpoint = -1
)

// Exported describes a file Export wrote.
type Exported struct {
	From    string // the folder the weights came from
	Step    int
	Tensors []checkpoint.Tensor // as written: PyTorch's names and layouts
	Meta    map[string]string
	// Unchecked are the stage files read without a checksum file to check
	// them against: final weights of a run older than those files.
	Unchecked []string
}

// Export writes the weights of the run in runDir, trained with config c, as
// one safetensors file at out (atomically, its checksum file beside it) with
// PyTorch's names and layouts
// (models.TorchParams), in the run's dtype. which is FinalWeights,
// LatestCheckpoint or a checkpoint's step. The metadata says the model, its
// spec and the run's config digest, and "format": "pt" as Hugging Face's
// loaders expect; it names no stage, so init_from reads the file in PyTorch's
// layout.
func Export(c *configs.Config, runDir string, which int, out string) (*Exported, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Path, err)
	}
	params, err := models.TorchParams(model)
	if err != nil {
		return nil, err
	}
	w, err := readRunWeights(c, runDir, which)
	if err != nil {
		return nil, err
	}
	byName, origin, from, step, unchecked, digest, files := w.byName, w.origin, w.from, w.step, w.unchecked, w.digest, w.files
	tensors, err := checkpoint.ToTorch(params, byName, origin)
	if err != nil {
		if len(files) < len(c.Stages) {
			return nil, fmt.Errorf("%s: %w (%s for the config's %d stages: did every stage finish?)", from, err, words.Count(len(files), "stage file"), len(c.Stages))
		}
		return nil, fmt.Errorf("%s: %w", from, err)
	}
	spec, err := exportSpec(c.Model)
	if err != nil {
		return nil, err
	}
	meta := map[string]string{
		"format":        "pt",
		"model":         c.Model.Name,
		"model_spec":    string(spec),
		"config_digest": digest,
		"step":          strconv.Itoa(step),
	}
	if _, _, err := checkpoint.WriteChecked(out, tensors, meta); err != nil {
		return nil, fmt.Errorf("--out %s: %w", out, err)
	}
	return &Exported{From: from, Step: step, Tensors: tensors, Meta: meta, Unchecked: unchecked}, nil
}

// runWeights are a run's weights as Export takes them, by pipetrain name.
type runWeights struct {
	byName    map[string]checkpoint.Tensor
	origin    map[string]string // the file each tensor came from
	from      string
	step      int
	unchecked []string
	digest    string
	files     []string
}

// readRunWeights reads the stage files of the weights of runDir that which
// names (see Export), checked against their checksums or manifest and
// against each other's config digest.
func readRunWeights(c *configs.Config, runDir string, which int) (*runWeights, error) {
	if len(c.Stages) == 0 {
		return nil, fmt.Errorf("%s: the config has no stages", c.Path)
	}
	if st, err := os.Stat(runDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s: not a run directory", runDir)
	}
	files, from, step, err := exportFiles(c, runDir, which)
	if err != nil {
		return nil, err
	}
	// A checkpoint's parts were checked against its manifest; final weights
	// are checked against their own checksum files.
	var unchecked []string
	if which == FinalWeights {
		if unchecked, err = checkpoint.VerifyFiles(files); err != nil {
			return nil, err
		}
	}
	byName := map[string]checkpoint.Tensor{}
	origin := map[string]string{}
	digests := map[string]string{} // config digest -> a file that has it
	for _, f := range files {
		ts, meta, err := checkpoint.Read(f)
		if err != nil {
			return nil, err
		}
		if d := meta["config_digest"]; d != "" {
			digests[d] = f
		}
		for _, t := range ts {
			if prev, dup := origin[t.Name]; dup {
				return nil, fmt.Errorf("tensor %s is in both %s and %s", t.Name, prev, f)
			}
			byName[t.Name], origin[t.Name] = t, f
		}
	}
	if len(digests) > 1 {
		var fs []string
		for _, f := range digests {
			fs = append(fs, f)
		}
		slices.Sort(fs)
		return nil, fmt.Errorf("%s: the stage files come from runs of different configs (%s differ): stale files of another run?", from, strings.Join(fs, " and "))
	}
	digest := c.Digest()
	for d := range digests {
		digest = d
	}
	return &runWeights{byName: byName, origin: origin, from: from, step: step, unchecked: unchecked, digest: digest, files: files}, nil
}

// exportSpec is the model section as an export records it (model_spec):
// the name, the dtype and the keys its family documents reading
// (models.FamilyDoc), so that a GPT's spec does not carry an MLP's sizes. A
// model no family registers keeps every key.
func exportSpec(m models.Spec) ([]byte, error) {
	b, err := json.Marshal(m)
	f, known := models.Lookup(m.Name)
	if err != nil || !known {
		return b, err
	}
	var all map[string]any
	if err := json.Unmarshal(b, &all); err != nil {
		return nil, err
	}
	own := map[string]any{"name": all["name"], "dtype": all["dtype"]}
	for _, k := range f.Doc().Keys {
		if v, ok := all[k.Key]; ok {
			own[k.Key] = v
		} else if v, ok := m.Own[k.Key]; ok {
			own[k.Key] = v // a key of the family's own, in Spec.Own
		}
	}
	return json.Marshal(own)
}

// exportFiles lists the stage files holding the weights Export takes, the
// folder they are in and the step they are of.
func exportFiles(c *configs.Config, runDir string, which int) (files []string, dir string, step int, err error) {
	root := runlog.CheckpointDir(runDir)
	committed := committedSteps(root)
	switch {
	case which == FinalWeights:
		// A pipelined run writes one file per stage, its reference one.
		dir = runlog.WeightsDir(runDir)
		files, _ = filepath.Glob(filepath.Join(dir, "stage-*.safetensors"))
		if len(files) == 0 {
			return nil, "", 0, fmt.Errorf("%s: no final weights (did the run finish?)%s", dir, checkpointHint(committed))
		}
		if stale := beyondStages(files, len(c.Stages)); len(stale) > 0 {
			return nil, "", 0, fmt.Errorf("%s: the config has %s, but %s: left by an earlier run of another split in this directory? (launch --force deletes an earlier run)",
				dir, words.Count(len(c.Stages), "stage"), strings.Join(stale, ", ")+" "+map[bool]string{true: "is there", false: "are there"}[len(stale) == 1])
		}
		meta, err := checkpoint.ReadMeta(files[0])
		if err != nil {
			return nil, "", 0, err
		}
		step, _ = strconv.Atoi(meta["step"])
		return files, dir, step, nil
	case which == LatestCheckpoint:
		if len(committed) == 0 {
			return nil, "", 0, fmt.Errorf("%s: no committed checkpoint", root)
		}
		which = committed[len(committed)-1]
	}
	dir = checkpoint.StepDir(root, which)
	m, err := checkpoint.ReadManifest(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil, "", 0, fmt.Errorf("%s: no committed checkpoint of step %d%s", root, which, checkpointHint(committed))
	}
	if err != nil {
		return nil, "", 0, err
	}
	if err := m.Verify(); err != nil {
		return nil, "", 0, err
	}
	// A reference run's checkpoint is one part holding every layer.
	if m.Stages != len(c.Stages) && m.Stages != 1 {
		return nil, "", 0, fmt.Errorf("%s: checkpoint of %d stages, the config has %d", dir, m.Stages, len(c.Stages))
	}
	for _, p := range m.Parts {
		// Verify refused a manifest naming any other file than a part.
		files = append(files, m.PartPath(p.Stage))
	}
	return files, dir, m.Step, nil
}

// committedSteps lists the steps of the committed checkpoints under root, in
// order.
func committedSteps(root string) []int {
	manifests, _ := filepath.Glob(filepath.Join(root, "step-*", checkpoint.ManifestName))
	var out []int
	for _, m := range manifests {
		if n, err := strconv.Atoi(strings.TrimPrefix(filepath.Base(filepath.Dir(m)), "step-")); err == nil {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

// checkpointHint names the checkpoints one could export instead.
func checkpointHint(steps []int) string {
	if len(steps) == 0 {
		return ""
	}
	s := make([]string, len(steps))
	for i, n := range steps {
		s[i] = strconv.Itoa(n)
	}
	return fmt.Sprintf("; committed checkpoints: steps %s (--checkpoint STEP or latest)", strings.Join(s, ", "))
}

// beyondStages lists the files among a run's final weights that are of a
// stage the config does not have.
func beyondStages(files []string, stages int) []string {
	var out []string
	for _, f := range files {
		n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(filepath.Base(f), "stage-"), ".safetensors"))
		if err == nil && n >= stages {
			out = append(out, filepath.Base(f))
		}
	}
	return out
}
