package stages

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"

	"github.com/pipetrain/pipetrain/checkpoint"
	"github.com/pipetrain/pipetrain/configs"
	"github.com/pipetrain/pipetrain/models"
)

// DefaultShardSize is export --format hf's --shard-size: 2 GB, as Hugging
// Face's save_pretrained shards in recent versions.
const DefaultShardSize = 2_000_000_000

// ExportedHF describes a Hugging Face checkpoint directory ExportHF wrote.
type ExportedHF struct {
	From      string
	Step      int
	Tensors   []checkpoint.RawTensor // as written: Hugging Face's names, layouts and dtypes
	Files     []string               // relative to the directory
	Unchecked []string
}

// torchDTypes are config.json's torch_dtype values by safetensors dtype.
var torchDTypes = map[string]string{"F32": "float32", "F16": "float16", "BF16": "bfloat16"}

// ExportHF writes the weights of the run in runDir (which as for Export)
// as a Hugging Face checkpoint directory at out (checkpoint.WriteHFDir):
// config.json, over the one model.from names when the model came from one,
// and the tensors under LlamaForCausalLM's or GPT2LMHeadModel's names
// (models.HFParams), sharded beyond shardSize bytes. Each tensor keeps the
// dtype it had in train.init_from's Hugging Face checkpoint; otherwise
// every tensor takes model.from's torch_dtype, or F32.
func ExportHF(c *configs.Config, runDir string, which int, out string, shardSize int64) (*ExportedHF, error) {
	model, err := models.Build(c.Model)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", c.Path, err)
	}
	params, err := models.HFParams(model)
	if err != nil {
		return nil, err
	}
	base, err := hfBaseConfig(c)
	if err != nil {
		return nil, err
	}
	dtype, err := hfExportDType(c, base)
	if err != nil {
		return nil, err
	}
	if st, err := os.Stat(runDir); err != nil || !st.IsDir() {
		return nil, fmt.Errorf("%s: not a run directory", runDir)
	}
	w, err := readRunWeights(c, runDir, which)
	if err != nil {
		return nil, err
	}
	tensors, err := checkpoint.ToHF(params, w.byName, dtype)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", w.from, err)
	}
	written := map[string]bool{}
	for _, t := range tensors {
		written[t.DType] = true
	}
	torchDType := "float32"
	if len(written) == 1 {
		for dt := range written {
			torchDType = torchDTypes[dt]
		}
	} else if s, ok := base["torch_dtype"].(string); ok {
		torchDType = s
	}
	config, err := models.HFConfig(model, base, torchDType)
	if err != nil {
		return nil, err
	}
	files, err := checkpoint.WriteHFDir(out, config, tensors, shardSize)
	if err != nil {
		return nil, fmt.Errorf("--out %s: %w", out, err)
	}
	return &ExportedHF{From: w.from, Step: w.step, Tensors: tensors, Files: files, Unchecked: w.unchecked}, nil
}

// hfBaseConfig is model.from's config.json, nil without model.from.
func hfBaseConfig(c *configs.Config) (map[string]any, error) {
	path := c.HFConfigPath()
	if path == "" {
		return nil, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("model.from: %w", err)
	}
	var out map[string]any
	if err := json.Unmarshal(b, &out); err != nil {
		return nil, fmt.Errorf("%s: %v", path, err)
	}
	return out, nil
}

// hfExportDType says the dtype each Hugging Face tensor is written in.
func hfExportDType(c *configs.Config, base map[string]any) (func(string) string, error) {
	all := "F32"
	if s, ok := base["torch_dtype"].(string); ok {
		for dt, name := range torchDTypes {
			if name == s {
				all = dt
			}
		}
	}
	var from map[string]string
	if init := c.InitFromPath(); init != "" && checkpoint.IsHFDir(init) {
		var err error
		if from, err = checkpoint.HFDTypes(init); err != nil {
			return nil, fmt.Errorf("train.init_from: %w", err)
		}
	}
	return func(name string) string {
		for _, n := range []string{name, strings.TrimPrefix(name, "transformer.")} {
			if dt, ok := from[n]; ok && torchDTypes[dt] != "" {
				return dt
			}
		}
		return all
	}, nil
}
