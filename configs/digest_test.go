package configs

import (
	"strings"
	"testing"
)

// TestTrainingDigestCoversWhatDocsSay changes one setting at a time: the
// digest, and the settings named by DiffSettings, must change exactly for what
// a checkpoint depends on (docs/reliability.md) and for nothing else.
func TestTrainingDigestCoversWhatDocsSay(t *testing.T) {
	base, err := Load("fmnist-mlp-4stage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	covered := map[string]func(c *Config){
		"model.hidden[1]":          func(c *Config) { c.Model.Hidden[1] = 64 },
		"model.activation":         func(c *Config) { c.Model.Activation = "tanh" },
		"data.micro_batches":       func(c *Config) { c.Data.MicroBatches = 4 },
		"data.batch_size":          func(c *Config) { c.Data.BatchSize = 128 },
		"train.seed":               func(c *Config) { c.Train.Seed = 2 },
		"train.optimizer.lr":       func(c *Config) { c.Train.Optimizer.LR = 0.01 },
		"schedule":                 func(c *Config) { c.Schedule = "gpipe" },
		"compute.blas_threads":     func(c *Config) { c.Compute.BLASThreads = 3 },
		"stages[1].layers[0]":      func(c *Config) { c.Stages[1].Layers = []string{"1-2"} },
		"virtual_stages":           func(c *Config) { c.VirtualStages = 2 },
		"train.optimizer.momentum": func(c *Config) { c.Train.Optimizer.Momentum = 0.5 },
	}
	for key, change := range covered {
		c := clone(base)
		change(c)
		if c.TrainingDigest() == base.TrainingDigest() {
			t.Errorf("changing %s left the training digest as it was", key)
		}
		d := DiffSettings(base.TrainingSettings(), c.TrainingSettings())
		if len(d) != 1 || d[0].Key != key {
			t.Errorf("changing %s: DiffSettings gave %v", key, d)
		}
	}
	ignored := map[string]func(c *Config){
		"name":                   func(c *Config) { c.Name = "other" },
		"train.steps":            func(c *Config) { c.Train.Steps = 7 },
		"train.log_every":        func(c *Config) { c.Train.LogEvery = 1 },
		"train.evaluate":         func(c *Config) { c.Train.Evaluate = !c.Train.Evaluate },
		"train.eval_every":       func(c *Config) { c.Train.EvalEvery = 5 },
		"transport.compression":  func(c *Config) { c.Transport.Compression = "fp16" },
		"transport.recv_timeout": func(c *Config) { c.Transport.RecvTimeout *= 2 },
		"stages[0].address":      func(c *Config) { c.Stages[0].Address = "127.0.0.1:1" },
		"checkpoint.every":       func(c *Config) { c.Checkpoint.Every = 1 },
		"recovery.max_restarts":  func(c *Config) { c.Recovery.MaxRestarts = 9 },
	}
	for key, change := range ignored {
		c := clone(base)
		change(c)
		if c.TrainingDigest() != base.TrainingDigest() {
			t.Errorf("changing %s changed the training digest; checkpoints do not depend on it", key)
		}
	}
}

func clone(c *Config) *Config {
	d := *c
	d.Model.Hidden = append([]int(nil), c.Model.Hidden...)
	d.Stages = append([]Stage(nil), c.Stages...)
	return &d
}

func TestDiffSettingsNamesEachChange(t *testing.T) {
	d := DiffSettings(map[string]string{"a": "1", "b": "2", "c": "3"}, map[string]string{"a": "1", "b": "5", "d": "4"})
	var got []string
	for _, c := range d {
		got = append(got, c.String())
	}
	want := "b: 2, now 5|c: 3, now (absent)|d: (absent), now 4"
	if strings.Join(got, "|") != want {
		t.Errorf("DiffSettings: %q, want %q", strings.Join(got, "|"), want)
	}
	if EnvName("model.hidden[2]") != "PIPETRAIN_MODEL_HIDDEN" || EnvName("train.optimizer.lr") != "PIPETRAIN_TRAIN_OPTIMIZER_LR" {
		t.Errorf("EnvName: %s, %s", EnvName("model.hidden[2]"), EnvName("train.optimizer.lr"))
	}
}

// With replicas, their count and the all-reduce's buckets decide each
// micro-batch and the order of the gradients' sums: both are covered. A run
// without replicas keeps the digest it had before replicas existed.
func TestTrainingDigestCoversReplicas(t *testing.T) {
	base, err := Load("fmnist-mlp-2x2.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for key, change := range map[string]func(c *Config){
		"data_parallel":           func(c *Config) { c.DataParallel = 4 },
		"all_reduce.bucket_bytes": func(c *Config) { c.AllReduce.BucketBytes = 4096 },
	} {
		c := clone(base)
		change(c)
		if d := DiffSettings(base.TrainingSettings(), c.TrainingSettings()); len(d) != 1 || d[0].Key != key {
			t.Errorf("changing %s: DiffSettings gave %v", key, d)
		}
	}
	c := clone(base)
	c.AllReduce.CheckEvery = 1
	if c.TrainingDigest() != base.TrainingDigest() {
		t.Error("all_reduce.check_every changed the training digest")
	}
	// A sharded optimizer computes the unsharded one's bits, and its
	// checkpoints hold the whole state: either resumes the other's.
	c = clone(base)
	c.AllReduce.ShardOptimizer = true
	if c.TrainingDigest() != base.TrainingDigest() {
		t.Error("all_reduce.shard_optimizer changed the training digest")
	}
	// Reduce-to-one folds in another order than the ring: a training
	// setting, named; "ring" spelled out is the default's digest.
	c = clone(base)
	c.AllReduce.Algorithm = "reduce-to-one"
	if d := DiffSettings(base.TrainingSettings(), c.TrainingSettings()); len(d) != 1 || d[0].Key != "all_reduce.algorithm" {
		t.Errorf("all_reduce.algorithm reduce-to-one: DiffSettings gave %v", d)
	}
	c.AllReduce.Algorithm = "ring"
	if c.TrainingDigest() != base.TrainingDigest() {
		t.Error("all_reduce.algorithm ring changed the training digest")
	}
	// Both transports sum the same values in the same order.
	c = clone(base)
	c.AllReduce.Transport = "grpc"
	if c.TrainingDigest() != base.TrainingDigest() {
		t.Error("all_reduce.transport changed the training digest")
	}
	// Each bucket is summed the same whenever it starts.
	c = clone(base)
	c.AllReduce.Overlap = "layer"
	if c.TrainingDigest() != base.TrainingDigest() {
		t.Error("all_reduce.overlap changed the training digest")
	}
	plain, err := Load("fmnist-mlp-4stage.yaml")
	if err != nil {
		t.Fatal(err)
	}
	for k := range plain.TrainingSettings() {
		if strings.HasPrefix(k, "data_parallel") || strings.HasPrefix(k, "all_reduce") {
			t.Errorf("a run without replicas has %s in its training settings", k)
		}
	}
}
