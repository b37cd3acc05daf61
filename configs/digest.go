package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// trainingState is what a checkpoint's contents depend on, keyed as in the YAML
// file: the model, its split into stages, the data and its order (the seed), the
// optimizer, the schedule (its accumulation order), the BLAS thread count
// (which changes the last bits of every product) and the replicas with the
// all-reduce's buckets (which cut the batch and order the gradients' sums). Everything else (the step
// count, logging, evaluation, checkpointing, the transport and where stages
// run) may change between a run and its resumption.
func (c *Config) trainingState() map[string]any {
	layers := make([]map[string]any, len(c.Stages))
	for i, s := range c.Stages {
		layers[i] = map[string]any{"layers": s.Layers}
	}
	state := map[string]any{
		"model":          c.Model,
		"data":           c.Data,
		"train":          map[string]any{"seed": c.Train.Seed, "optimizer": c.Train.Optimizer},
		"schedule":       c.Schedule,
		"virtual_stages": c.VirtualStages,
		"compute":        map[string]any{"blas_threads": c.Compute.BLASThreads},
		"stages":         layers,
	}
	if c.Replicas() > 1 {
		// Replicas change each micro-batch's size and, with the bucket
		// size, the order in which gradients are summed. A run without
		// replicas keeps the digest it always had.
		state["data_parallel"] = c.DataParallel
		ar := map[string]any{"bucket_bytes": c.BucketBytes()}
		if a := c.ReduceAlgorithm(); a != AllReduceAlgorithms[0] {
			// The algorithm orders the sums; a ring run keeps its digest.
			ar["algorithm"] = a
		}
		if c.ReduceAlgorithm() == "hierarchical" {
			// The hosts' runs of replicas order the sums too (ReplicaHosts);
			// where the hosts themselves are does not.
			hosts := make([][]int, len(c.Stages))
			for i := range c.Stages {
				hosts[i], _ = c.ReplicaHosts(i)
			}
			ar["hosts"] = hosts
		}
		state["all_reduce"] = ar
	}
	if c.PSEnabled() {
		// Servers sum the gradients in worker order, and backup workers
		// drop some; a run without servers keeps its digest.
		ps := c.ParameterServers
		state["parameter_servers"] = map[string]any{"count": ps.Count, "mode": ps.Mode, "aggregate": ps.Aggregate, "max_staleness": ps.MaxStaleness}
	}
	if c.Train.ClipGradNorm > 0 {
		// Clipping changes the updates; a run without it keeps its digest.
		state["train"].(map[string]any)["clip_grad_norm"] = c.Train.ClipGradNorm
	}
	if s := c.Train.LRSchedule; !s.Constant() {
		// The rates depend on the schedule, its decay_steps resolved (the
		// run's steps by default); a run without one keeps its digest.
		state["train"].(map[string]any)["lr_schedule"] = s.Resolve(c.Train.Steps)
	}
	if c.ScheduleText != "" {
		// A custom schedule counts by its contents, not by its file's path.
		state["schedule_file"] = c.ScheduleText
	}
	return state
}

// TrainingDigest identifies what a checkpoint's contents depend on (see
// trainingState); checkpoints record it, and a run resumes only from one whose
// digest equals its own.
func (c *Config) TrainingDigest() string {
	b, err := json.Marshal(c.trainingState())
	if err != nil {
		panic(err) // Config holds only plain values
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// TrainingSettings lists every setting the training digest covers, by its full
// key (model.hidden[1], stages[2].layers[0], train.optimizer.lr), with its value
// as JSON. Two configs have equal digests exactly when these are equal, so a
// difference can be reported by name.
func (c *Config) TrainingSettings() map[string]string {
	b, err := json.Marshal(c.trainingState())
	if err != nil {
		panic(err)
	}
	var tree any
	if err := json.Unmarshal(b, &tree); err != nil {
		panic(err)
	}
	out := map[string]string{}
	flatten("", tree, out)
	return out
}

func flatten(key string, v any, out map[string]string) {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if key != "" {
				k = key + "." + k
			}
			flatten(k, e, out)
		}
	case []any:
		if len(v) == 0 {
			out[key] = "[]"
		}
		for i, e := range v {
			flatten(fmt.Sprintf("%s[%d]", key, i), e, out)
		}
	default:
		b, _ := json.Marshal(v)
		out[key] = string(b)
	}
}

// SettingChange is one training setting that differs between two configs.
type SettingChange struct {
	Key      string
	Was, Now string // values as JSON; "" when the setting is absent on that side
}

func (s SettingChange) String() string {
	was, now := s.Was, s.Now
	if was == "" {
		was = "(absent)"
	}
	if now == "" {
		now = "(absent)"
	}
	return fmt.Sprintf("%s: %s, now %s", s.Key, was, now)
}

// DiffSettings lists, sorted by key, the settings of TrainingSettings that
// differ between was and now.
func DiffSettings(was, now map[string]string) []SettingChange {
	var out []SettingChange
	for k, w := range was {
		if n := now[k]; n != w {
			out = append(out, SettingChange{Key: k, Was: w, Now: n})
		}
	}
	for k, n := range now {
		if _, ok := was[k]; !ok {
			out = append(out, SettingChange{Key: k, Now: n})
		}
	}
	slices.SortFunc(out, func(a, b SettingChange) int { return strings.Compare(a.Key, b.Key) })
	return out
}

// EnvName is the PIPETRAIN_* variable that overrides a key: its dots become
// underscores, and an index (model.hidden[1]) names the whole list.
func EnvName(key string) string {
	key, _, _ = strings.Cut(key, "[")
	return "PIPETRAIN_" + strings.ToUpper(strings.ReplaceAll(key, ".", "_"))
}
