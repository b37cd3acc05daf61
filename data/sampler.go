package data

import (
	"fmt"
	"math/rand/v2"
)

// Sampler picks each training step's examples as a pure function of
// (Seed, step), so every process of a run agrees on step k's batch without
// talking, and a resumed run sees the same batches as an uninterrupted one.
//
// It shuffles without replacement per epoch: an epoch has N/Batch steps (the
// remainder is dropped so every batch is full), the epoch's permutation comes
// from a PCG generator seeded with (Seed, epoch) and a Fisher-Yates shuffle,
// and step k takes positions [(k%stepsPerEpoch)*Batch, +Batch) of it.
//
// A Sampler caches the current epoch's permutation; it is not safe for
// concurrent use.
type Sampler struct {
	Seed     uint64
	N, Batch int

	epoch int   // epoch of perm, -1 before the first call
	perm  []int // permutation of [0,N) for epoch
}

// NewSampler returns a sampler over n examples taking batch of them per step.
func NewSampler(seed uint64, n, batch int) (*Sampler, error) {
	if batch < 1 || batch > n {
		return nil, fmt.Errorf("data: batch size %d out of range [1,%d]", batch, n)
	}
	return &Sampler{Seed: seed, N: n, Batch: batch, epoch: -1}, nil
}

// StepsPerEpoch is the number of full batches in one pass over the data.
func (s *Sampler) StepsPerEpoch() int { return s.N / s.Batch }

// Indices returns the example indices of step (a new slice of len Batch).
func (s *Sampler) Indices(step int) []int {
	if step < 0 {
		panic(fmt.Sprintf("data: Sampler.Indices: negative step %d", step))
	}
	spe := s.StepsPerEpoch()
	if epoch := step / spe; epoch != s.epoch {
		s.shuffle(epoch)
	}
	start := (step % spe) * s.Batch
	return append([]int(nil), s.perm[start:start+s.Batch]...)
}

// shuffle builds epoch's permutation in s.perm.
func (s *Sampler) shuffle(epoch int) {
	if s.perm == nil {
		s.perm = make([]int, s.N)
	}
	for i := range s.perm {
		s.perm[i] = i
	}
	r := rand.New(rand.NewPCG(s.Seed, uint64(epoch)))
	for i := len(s.perm) - 1; i > 0; i-- {
		j := r.IntN(i + 1)
		s.perm[i], s.perm[j] = s.perm[j], s.perm[i]
	}
	s.epoch = epoch
}
