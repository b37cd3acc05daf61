package configs

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
)

// TrainingDigest identifies what a checkpoint's contents depend on: the model, its
// split into stages, the data, the optimizer and the schedule. Unlike Digest it
// leaves out the step count, logging, evaluation, the transport and where stages
// run, so a run can be resumed on other hosts or trained for more steps.
func (c *Config) TrainingDigest() string {
	d := *c
	d.Train.Steps, d.Train.LogEvery, d.Train.Evaluate = 0, 0, false
	d.Transport = Transport{}
	d.Stages = make([]Stage, len(c.Stages))
	for i, s := range c.Stages {
		d.Stages[i] = Stage{Layers: s.Layers}
	}
	b, err := json.Marshal(&d)
	if err != nil {
		panic(err) // Config holds only plain values
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}
