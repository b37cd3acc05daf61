// Package engine computes one pipeline stage's share of a model with
// gorgonia: the stage's layers compiled once into a program whose tape pauses
// where the upstream gradient enters (Forward runs to the pause and keeps the
// micro-batch's activations in its own tape machine; Backward resumes it),
// the split backward of zero-bubble schedules (Input, then a separately
// compiled weight-gradient program), the weights and their optimizer step,
// register reuse between runs, and the cost measurements plan and simulate
// use. It knows nothing of configs, links or schedules: the stage executor
// (package stages) decides what runs when and moves the tensors, and the
// callers of the cost and memory models hand them plain values (Pipeline).
package engine
